//! Topology: where the ranks of a communicator run — which ranks share a host, each host's NUMA
//! nodes, caches, NICs and GPUs, each rank's CPU binding and NIC. Discovery
//! ([`discover`]) reads the local system once at communicator creation; the result is plain,
//! versioned data exchanged through the store (one key per rank), loadable from a fixture
//! (`OXCCL_TOPO_FILE`) and written for people and tools (`OXCCL_TOPO_DUMP_FILE`, [`Topology`]'s
//! `Display`). No sockets here.

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::types::Rank;

pub(crate) mod discover;
pub(crate) mod nvml;

/// The version of [`Topology`]'s serialized form; a fixture of another version is refused.
pub const TOPOLOGY_VERSION: u32 = 1;

/// This process's host identity: `OXCCL_HOST_ID` if set (through `configured`), else a hash of
/// the kernel boot id, the host name and the network namespace, so that two network namespaces
/// on one machine (simulated hosts) count as different hosts while processes of one container
/// agree.
pub fn host_id(configured: Option<&str>) -> String {
    if let Some(id) = configured {
        return id.to_owned();
    }
    let boot = boot_id();
    let name = host_name();
    let netns = std::fs::read_link("/proc/self/ns/net")
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let digest = Sha256::new()
        .chain_update(boot.trim())
        .chain_update([0])
        .chain_update(&name)
        .chain_update([0])
        .chain_update(netns)
        .finalize();
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("{name}-{hex}")
}

/// The kernel this process runs under: a hash of its boot id ("" if unreadable). Ranks under
/// one kernel share its CPUs even where they count as different hosts (network namespaces on
/// one machine: simulated hosts, containers).
pub(crate) fn kernel_id() -> String {
    let boot = boot_id();
    if boot.trim().is_empty() {
        return String::new();
    }
    let digest = Sha256::new()
        .chain_update(b"kernel\0")
        .chain_update(boot.trim())
        .finalize();
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// The kernel's boot id ("" if unreadable).
fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default()
}

/// The kernel's host name.
pub(crate) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// Where the ranks of a communicator run: built by discovery or read from a fixture, read
/// through its fields and methods.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Topology {
    /// [`TOPOLOGY_VERSION`].
    pub version: u32,
    /// Host identity of each rank.
    pub hosts: Vec<String>,
    /// Each distinct host's hardware, in order of first appearance among the ranks.
    pub machines: Vec<Host>,
    /// Each rank's place.
    pub ranks: Vec<Place>,
}

/// One host's hardware.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Host {
    /// Host identity (what [`Topology::hosts`] holds).
    pub id: String,
    /// Host name.
    pub name: String,
    /// NUMA nodes (one holding everything where the kernel shows none).
    pub numa: Vec<NumaNode>,
    /// Caches as CPU 0 sees them, smallest level first.
    pub caches: Vec<Cache>,
    /// Network interfaces but loopback.
    pub nics: Vec<Nic>,
    /// GPUs on the PCI bus.
    pub gpus: Vec<Gpu>,
}

/// A NUMA node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaNode {
    /// Node number.
    pub id: u32,
    /// Its CPUs, in Linux cpulist syntax (`0-3,8-11`).
    pub cpus: String,
    /// Its memory in bytes (0: unknown).
    pub memory_bytes: u64,
}

/// A CPU cache.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cache {
    /// Level (1, 2, 3).
    pub level: u8,
    /// `Data`, `Instruction` or `Unified`.
    pub kind: String,
    /// Size in bytes.
    pub bytes: u64,
    /// How many CPUs share one such cache.
    pub shared_by: u32,
}

/// A network interface.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nic {
    /// Interface name.
    pub name: String,
    /// Its IP addresses.
    pub addresses: Vec<String>,
    /// Link speed in Mbit/s (`None`: the kernel does not say, as for virtual interfaces).
    pub speed_mbps: Option<u64>,
    /// NUMA node of its device (`None`: unknown or virtual).
    pub numa: Option<i32>,
    /// RDMA devices on it (`mlx5_0`, `rxe0`).
    pub rdma: Vec<String>,
}

/// A GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    /// PCI bus id (`0000:3b:00.0`).
    pub pci: String,
    /// PCI vendor id (`0x10de`).
    pub vendor: String,
    /// PCI device id.
    pub device: String,
    /// NUMA node (`None`: unknown).
    pub numa: Option<i32>,
    /// Its NVLinks that are up and carry peer-to-peer traffic, grouped by the device at their
    /// far end (from NVML; empty where NVML is absent or the GPU has none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvlinks: Vec<NvLink>,
    /// The GPUs of this host (PCI bus ids) it may read peer to peer, as NVML says (`None`:
    /// unknown — no NVML, or not an NVIDIA GPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p2p: Option<Vec<String>>,
}

/// The NVLinks between a GPU and one device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvLink {
    /// PCI bus id of the device at the far end.
    pub peer: String,
    /// What it is: `gpu` (another GPU of this host), `nvswitch`, `cpu` (an IBM NPU) or `other`.
    pub kind: String,
    /// How many links go there.
    pub links: u32,
}

/// Where one rank runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Place {
    /// Index of its host in [`Topology::machines`].
    pub host: usize,
    /// Process id.
    pub pid: u32,
    /// CPUs it may run on (cpulist syntax).
    pub cpus: String,
    /// NUMA nodes those CPUs belong to.
    pub numa: Vec<u32>,
    /// The interface its TCP links use (`None`: none chosen).
    pub nic: Option<String>,
    /// The RDMA device port its rdma links use, as `device:port (kind, GID or LID, netdev)`
    /// (`None`: no rdma transport).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma: Option<String>,
    /// The kernel it runs under ([`kernel_id`]; "" unknown, as in fixtures that lack it):
    /// ranks under one kernel compete for the same CPUs.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kernel: String,
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

    /// Whether two ranks compete for the same CPUs: they run under the same known kernel, or
    /// (where either kernel is unknown) on the same host.
    pub fn share_cpus(&self, a: Rank, b: Rank) -> bool {
        let (ka, kb) = (&self.ranks[a].kernel, &self.ranks[b].kernel);
        if ka.is_empty() || kb.is_empty() {
            self.same_host(a, b)
        } else {
            ka == kb
        }
    }

    /// Whether every rank under `rank`'s kernel is bound to CPUs no other such rank may run on
    /// (every binding known): then no rank waits for a core another one holds.
    pub fn own_cpus(&self, rank: Rank) -> bool {
        let mut all = Vec::new();
        for r in (0..self.ranks.len()).filter(|&r| self.share_cpus(r, rank)) {
            let cpus = cpulist::parse(&self.ranks[r].cpus);
            if cpus.is_empty() {
                return false;
            }
            all.extend(cpus);
        }
        let listed = all.len();
        all.sort_unstable();
        all.dedup();
        all.len() == listed
    }

    /// Whether `rank` may wait for a core another rank holds: more ranks run under its kernel
    /// than the `cores` it may use, and they are not bound to CPUs of their own. Counted per
    /// kernel, not per host: simulated hosts (network namespaces) on one machine share its
    /// cores, and counted per host, 2 simulated hosts × 2 ranks on 2 cores looked roomy.
    pub fn crowded(&self, rank: Rank, cores: usize) -> bool {
        let sharers = (0..self.ranks.len())
            .filter(|&r| self.share_cpus(r, rank))
            .count();
        sharers > cores && !self.own_cpus(rank)
    }

    /// The whole job's topology from each rank's own view (rank r's host and place), hosts
    /// described by the first rank on each.
    pub(crate) fn assemble(views: Vec<(Host, Place)>) -> Topology {
        let mut machines: Vec<Host> = Vec::new();
        let mut hosts = Vec::with_capacity(views.len());
        let mut ranks = Vec::with_capacity(views.len());
        for (host, mut place) in views {
            hosts.push(host.id.clone());
            place.host = match machines.iter().position(|m| m.id == host.id) {
                Some(i) => i,
                None => {
                    machines.push(host);
                    machines.len() - 1
                }
            };
            ranks.push(place);
        }
        Topology {
            version: TOPOLOGY_VERSION,
            hosts,
            machines,
            ranks,
        }
    }

    /// A topology in which only the host identities are known.
    #[cfg(test)]
    pub(crate) fn of_hosts(hosts: Vec<String>) -> Topology {
        let views = hosts
            .into_iter()
            .map(|id| {
                let host = Host {
                    name: id.clone(),
                    id,
                    numa: Vec::new(),
                    caches: Vec::new(),
                    nics: Vec::new(),
                    gpus: Vec::new(),
                };
                let place = Place {
                    host: 0,
                    pid: std::process::id(),
                    cpus: String::new(),
                    numa: Vec::new(),
                    nic: None,
                    rdma: None,
                    kernel: String::new(),
                };
                (host, place)
            })
            .collect();
        Topology::assemble(views)
    }

    /// The JSON form (what `OXCCL_TOPO_DUMP_FILE` holds and `OXCCL_TOPO_FILE` reads).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// A topology from its JSON form, checked: the version, one place and host identity per
    /// rank, places naming hosts that exist and whose identity matches the rank's.
    pub fn from_json(text: &str) -> Result<Topology> {
        let bad = |why: String| Error::InvalidArgument(format!("topology: {why}"));
        let t: Topology = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        if t.version != TOPOLOGY_VERSION {
            return Err(bad(format!(
                "version {} is not {TOPOLOGY_VERSION}, the one this library reads",
                t.version
            )));
        }
        if t.ranks.len() != t.hosts.len() {
            return Err(bad(format!(
                "{} ranks have host identities but {} have places",
                t.hosts.len(),
                t.ranks.len()
            )));
        }
        for (r, p) in t.ranks.iter().enumerate() {
            match t.machines.get(p.host) {
                Some(m) if m.id == t.hosts[r] => {}
                _ => {
                    return Err(bad(format!(
                        "rank {r}'s place names host {} but its host identity is {:?}",
                        p.host, t.hosts[r]
                    )));
                }
            }
        }
        Ok(t)
    }

    /// The longest fixture read (64 MiB: a job of about 100,000 ranks).
    pub const MAX_FILE_BYTES: usize = 64 << 20;

    /// Reads a fixture (`OXCCL_TOPO_FILE`): a regular file of at most
    /// [`Topology::MAX_FILE_BYTES`].
    pub fn load(path: &Path) -> Result<Topology> {
        let text = crate::files::read_text(path, Topology::MAX_FILE_BYTES).map_err(|e| {
            Error::InvalidArgument(format!(
                "OXCCL_TOPO_FILE {}: cannot be read: {e}",
                path.display()
            ))
        })?;
        Topology::from_json(&text)
            .map_err(|e| Error::InvalidArgument(format!("OXCCL_TOPO_FILE {}: {e}", path.display())))
    }
}

impl fmt::Display for Topology {
    /// Hosts × ranks, then each host's NUMA nodes, caches, NICs and GPUs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "topology: {} ranks on {} hosts",
            self.nranks(),
            self.machines.len()
        )?;
        for (h, m) in self.machines.iter().enumerate() {
            let ranks: Vec<String> = (0..self.ranks.len())
                .filter(|&r| self.ranks[r].host == h)
                .map(|r| r.to_string())
                .collect();
            writeln!(
                f,
                "host {h} {} ({}): ranks {}",
                m.name,
                m.id,
                ranks.join(" ")
            )?;
            for n in &m.numa {
                writeln!(
                    f,
                    "  numa {}: cpus {}, {}",
                    n.id,
                    n.cpus,
                    gib(n.memory_bytes)
                )?;
            }
            if !m.caches.is_empty() {
                let c: Vec<String> = m
                    .caches
                    .iter()
                    .map(|c| {
                        let kind = match c.kind.as_str() {
                            "Data" => "d",
                            "Instruction" => "i",
                            _ => "",
                        };
                        let by = match c.shared_by {
                            1 => "cpu".to_owned(),
                            n => format!("{n} cpus"),
                        };
                        format!("L{}{kind} {} per {by}", c.level, size(c.bytes))
                    })
                    .collect();
                writeln!(f, "  caches: {}", c.join(", "))?;
            }
            for n in &m.nics {
                writeln!(
                    f,
                    "  nic {}: {}; {}; numa {}; rdma {}",
                    n.name,
                    if n.addresses.is_empty() {
                        "no address".to_owned()
                    } else {
                        n.addresses.join(" ")
                    },
                    n.speed_mbps
                        .map_or("speed unknown".to_owned(), |s| format!("{s} Mbit/s")),
                    n.numa.map_or("-".to_owned(), |x| x.to_string()),
                    if n.rdma.is_empty() {
                        "-".to_owned()
                    } else {
                        n.rdma.join(" ")
                    }
                )?;
            }
            if m.gpus.is_empty() {
                writeln!(f, "  gpus: none")?;
            }
            for g in &m.gpus {
                let (nvlink, p2p) = match &g.p2p {
                    None => ("?".to_owned(), "?".to_owned()),
                    Some(p2p) => (
                        if g.nvlinks.is_empty() {
                            "-".to_owned()
                        } else {
                            let l: Vec<String> = g
                                .nvlinks
                                .iter()
                                .map(|l| format!("{} x{} ({})", l.peer, l.links, l.kind))
                                .collect();
                            l.join(", ")
                        },
                        if p2p.is_empty() {
                            "-".to_owned()
                        } else {
                            p2p.join(" ")
                        },
                    ),
                };
                writeln!(
                    f,
                    "  gpu {} ({}:{}); numa {}; nvlink {nvlink}; p2p {p2p}",
                    g.pci,
                    g.vendor,
                    g.device,
                    g.numa.map_or("-".to_owned(), |x| x.to_string())
                )?;
            }
            for (r, p) in self.ranks.iter().enumerate().filter(|(_, p)| p.host == h) {
                let numa: Vec<String> = p.numa.iter().map(u32::to_string).collect();
                writeln!(
                    f,
                    "  rank {r}: pid {}, cpus {}, numa {}, nic {}{}",
                    p.pid,
                    if p.cpus.is_empty() { "?" } else { &p.cpus },
                    if numa.is_empty() {
                        "?".to_owned()
                    } else {
                        numa.join(",")
                    },
                    p.nic.as_deref().unwrap_or("-"),
                    p.rdma
                        .as_deref()
                        .map_or(String::new(), |d| format!(", rdma {d}"))
                )?;
            }
        }
        Ok(())
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
}

fn size(bytes: u64) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

/// Linux cpulist syntax (`0-3,8,10-11`).
pub(crate) mod cpulist {
    /// The CPUs a cpulist names, ascending; malformed parts are skipped and ranges are capped
    /// at 65,536 CPUs so a garbage list cannot allocate without bound.
    pub fn parse(list: &str) -> Vec<u32> {
        let mut out = Vec::new();
        for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (a, b) = match part.split_once('-') {
                Some((a, b)) => (a.trim().parse::<u32>(), b.trim().parse::<u32>()),
                None => (part.parse::<u32>(), part.parse::<u32>()),
            };
            if let (Ok(a), Ok(b)) = (a, b)
                && a <= b
                && b < 65_536
            {
                out.extend(a..=b);
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_id_is_stable_and_overridable() {
        assert_eq!(host_id(None), host_id(None));
        assert_eq!(host_id(Some("node7")), "node7");
        let t = Topology::of_hosts(vec!["a".into(), "b".into(), "a".into()]);
        assert_eq!(t.nhosts(), 2);
        assert!(t.same_host(0, 2) && !t.same_host(0, 1));
        assert_eq!(t.ranks[2].host, 0);
    }

    #[test]
    fn ranks_own_their_cpus_only_where_every_binding_on_the_host_is_disjoint() {
        let mut t = Topology::of_hosts(vec!["a".into(), "b".into(), "a".into()]);
        // Unknown bindings: not known to be disjoint.
        assert!(!t.own_cpus(0));
        t.ranks[0].cpus = "0".into();
        t.ranks[2].cpus = "1-2".into();
        assert!(t.own_cpus(0) && t.own_cpus(2));
        // Rank 1 is on another host: its binding is its own business, but it must be known.
        assert!(!t.own_cpus(1));
        t.ranks[1].cpus = "0-1".into();
        assert!(t.own_cpus(1) && t.own_cpus(0));
        t.ranks[2].cpus = "0-1".into();
        assert!(!t.own_cpus(0) && !t.own_cpus(2));
    }

    #[test]
    fn ranks_are_crowded_by_the_kernel_they_share_not_the_host() {
        // Two hosts of two ranks, every rank allowed on CPUs 0-1.
        let mut t = Topology::of_hosts(vec!["a".into(), "b".into(), "a".into(), "b".into()]);
        for p in &mut t.ranks {
            p.cpus = "0-1".into();
        }
        // Kernels unknown: each host's 2 ranks count against its cores.
        assert!(!t.share_cpus(0, 1) && t.share_cpus(0, 2));
        assert!(!t.crowded(0, 2) && t.crowded(0, 1));
        // One kernel under both hosts (network namespaces on one machine): 4 ranks on 2 cores.
        for p in &mut t.ranks {
            p.kernel = "k".into();
        }
        assert!(t.share_cpus(0, 1) && t.crowded(0, 2) && t.crowded(3, 2) && !t.crowded(0, 4));
        // Each host binds its ranks to CPUs 0 and 1: disjoint per host, not per kernel.
        t.ranks[0].cpus = "0".into();
        t.ranks[2].cpus = "1".into();
        t.ranks[1].cpus = "0".into();
        t.ranks[3].cpus = "1".into();
        assert!(!t.own_cpus(0) && t.crowded(0, 2));
        // Two kernels (two machines): every rank has a CPU of its own there.
        t.ranks[1].kernel = "j".into();
        t.ranks[3].kernel = "j".into();
        assert!(t.own_cpus(0) && !t.crowded(0, 1) && !t.crowded(1, 1));
        // A rank whose kernel is unknown falls back to its host.
        t.ranks[3].kernel = String::new();
        assert!(t.share_cpus(3, 1) && !t.share_cpus(3, 0) && t.share_cpus(1, 3));
    }

    #[test]
    fn cpulists_parse_and_garbage_is_skipped() {
        assert_eq!(cpulist::parse("0-3,8,10-11"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(cpulist::parse(" 5 ,x,3-1,7-70000,2"), vec![2, 5]);
        assert!(cpulist::parse("").is_empty());
    }

    #[test]
    fn json_round_trips_and_bad_fixtures_are_refused() {
        let t = Topology::of_hosts(vec!["a".into(), "b".into()]);
        assert_eq!(Topology::from_json(&t.to_json()).unwrap(), t);
        let mut v = t.clone();
        v.version = 99;
        assert!(Topology::from_json(&v.to_json()).is_err());
        let mut v = t.clone();
        v.ranks.pop();
        assert!(Topology::from_json(&v.to_json()).is_err());
        let mut v = t.clone();
        v.ranks[1].host = 0;
        assert!(Topology::from_json(&v.to_json()).is_err());
        assert!(Topology::from_json("{").is_err());
        assert!(Topology::from_json("[1,2]").is_err());
    }

    #[test]
    fn display_shows_hosts_ranks_and_hardware() {
        let (host, place) =
            discover::local(Path::new("/"), "id0", "box", Some("eth0".to_owned()), None);
        let t = Topology::assemble(vec![(host.clone(), place.clone()), (host, place)]);
        let text = t.to_string();
        assert!(text.starts_with("topology: 2 ranks on 1 hosts\nhost 0 box (id0): ranks 0 1\n"));
        assert!(text.contains("  numa 0: cpus "), "{text}");
        assert!(text.contains("  rank 1: pid "), "{text}");
        assert!(text.contains("nic eth0"), "{text}");
    }

    #[test]
    fn display_shows_nvlinks_and_peer_to_peer_or_that_they_are_unknown() {
        let (mut host, place) = discover::local(Path::new("/"), "id0", "box", None, None);
        let gpu = |pci: &str, nvlinks: Vec<NvLink>, p2p: Option<Vec<String>>| Gpu {
            pci: pci.into(),
            vendor: "0x10de".into(),
            device: "0x2330".into(),
            numa: Some(1),
            nvlinks,
            p2p,
        };
        let link = |peer: &str, kind: &str, links| NvLink {
            peer: peer.into(),
            kind: kind.into(),
            links,
        };
        host.gpus = vec![
            gpu(
                "0000:1a:00.0",
                vec![
                    link("0000:1b:00.0", "gpu", 4),
                    link("0000:05:00.0", "nvswitch", 2),
                ],
                Some(vec!["0000:1b:00.0".into()]),
            ),
            gpu("0000:1b:00.0", vec![], Some(vec![])),
            gpu("0000:1c:00.0", vec![], None),
        ];
        let t = Topology::assemble(vec![(host, place)]);
        let text = t.to_string();
        for line in [
            "  gpu 0000:1a:00.0 (0x10de:0x2330); numa 1; nvlink 0000:1b:00.0 x4 (gpu), \
             0000:05:00.0 x2 (nvswitch); p2p 0000:1b:00.0\n",
            "  gpu 0000:1b:00.0 (0x10de:0x2330); numa 1; nvlink -; p2p -\n",
            "  gpu 0000:1c:00.0 (0x10de:0x2330); numa 1; nvlink ?; p2p ?\n",
        ] {
            assert!(text.contains(line), "{line:?} not in\n{text}");
        }
        // The JSON form carries them and leaves them out where unknown (older fixtures parse).
        let json = t.to_json();
        assert_eq!(Topology::from_json(&json).unwrap(), t);
        assert_eq!(json.matches("\"p2p\"").count(), 2, "{json}");
    }
}
