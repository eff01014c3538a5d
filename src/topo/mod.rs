//! Topology: which ranks share a host (and later NUMA nodes, NICs, GPUs). Discovery reads the
//! local system once at communicator creation; the result is plain data exchanged through the
//! store. No sockets here.

use sha2::{Digest, Sha256};

use crate::types::Rank;

/// This process's host identity: `OXCCL_HOST_ID` if set (through `configured`), else a hash of
/// the kernel boot id, the host name and the network namespace, so that two network namespaces
/// on one machine (simulated hosts) count as different hosts while processes of one container
/// agree.
pub fn host_id(configured: Option<&str>) -> String {
    if let Some(id) = configured {
        return id.to_owned();
    }
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let netns = std::fs::read_link("/proc/self/ns/net")
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let digest = Sha256::new()
        .chain_update(boot.trim())
        .chain_update([0])
        .chain_update(name.trim())
        .chain_update([0])
        .chain_update(netns)
        .finalize();
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{hex}", name.trim())
}

/// Where the ranks of a communicator run. Grows with discovery (NUMA, NICs, GPUs): built only
/// here, read through its fields and methods.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Topology {
    /// Host identity of each rank.
    pub hosts: Vec<String>,
}

impl Topology {
    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.hosts.len()
    }

    /// Number of distinct hosts.
    pub fn nhosts(&self) -> usize {
        let mut h: Vec<&String> = self.hosts.iter().collect();
        h.sort();
        h.dedup();
        h.len()
    }

    /// Whether two ranks share a host.
    pub fn same_host(&self, a: Rank, b: Rank) -> bool {
        self.hosts[a] == self.hosts[b]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_id_is_stable_and_overridable() {
        assert_eq!(host_id(None), host_id(None));
        assert_eq!(host_id(Some("node7")), "node7");
        let t = Topology {
            hosts: vec!["a".into(), "b".into(), "a".into()],
        };
        assert_eq!(t.nhosts(), 2);
        assert!(t.same_host(0, 2) && !t.same_host(0, 1));
    }
}
