//! Which host each rank runs on, as the algorithms see it: hosts numbered in order of first
//! appearance (the host of rank 0 is host 0), and each host's ranks in ascending order. Plain
//! data built from any labels, so schedules and the simulator need nothing from discovery.

use std::collections::HashMap;
use std::hash::Hash;

use crate::types::Rank;

/// The ranks of a communicator grouped by host.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Hosts {
    /// Host index of each rank.
    of: Vec<usize>,
    /// Each host's ranks, ascending.
    members: Vec<Vec<Rank>>,
    /// Each rank's position among its host's ranks.
    local: Vec<usize>,
}

impl Hosts {
    /// Ranks grouped by equal labels: ranks `a` and `b` share a host when `labels[a] ==
    /// labels[b]`.
    pub fn from_labels<T: Eq + Hash>(labels: &[T]) -> Hosts {
        let mut index: HashMap<&T, usize> = HashMap::new();
        let host = labels.iter().map(|l| {
            let next = index.len();
            *index.entry(l).or_insert(next)
        });
        Hosts::from_indices(host.collect())
    }

    /// Ranks grouped by host index, the indices numbered in order of first appearance.
    fn from_indices(of: Vec<usize>) -> Hosts {
        let mut members: Vec<Vec<Rank>> = Vec::new();
        let mut local = Vec::with_capacity(of.len());
        for (r, &h) in of.iter().enumerate() {
            if h == members.len() {
                members.push(Vec::new());
            }
            local.push(members[h].len());
            members[h].push(r);
        }
        Hosts { of, members, local }
    }

    /// `n` ranks, each on a host of its own.
    pub fn flat(n: usize) -> Hosts {
        Hosts::from_indices((0..n).collect())
    }

    /// `n` ranks on one host.
    pub fn single(n: usize) -> Hosts {
        Hosts::from_indices(vec![0; n])
    }

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.of.len()
    }

    /// Number of hosts.
    pub fn count(&self) -> usize {
        self.members.len()
    }

    /// The host of rank `r`.
    pub fn host(&self, r: Rank) -> usize {
        self.of[r]
    }

    /// The ranks of host `h`, ascending.
    pub fn members(&self, h: usize) -> &[Rank] {
        &self.members[h]
    }

    /// Rank `r`'s position among its host's ranks.
    pub fn local(&self, r: Rank) -> usize {
        self.local[r]
    }

    /// The most ranks any host has.
    pub fn largest(&self) -> usize {
        self.members.iter().map(Vec::len).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_by_label_in_order_of_first_appearance() {
        let h = Hosts::from_labels(&["b", "a", "b", "c", "a", "a"]);
        assert_eq!(h.count(), 3);
        assert_eq!(h.members(0), &[0, 2]);
        assert_eq!(h.members(1), &[1, 4, 5]);
        assert_eq!(h.members(2), &[3]);
        assert_eq!((h.host(4), h.local(4)), (1, 1));
        assert_eq!(h.largest(), 3);
        assert_eq!(Hosts::flat(3).count(), 3);
        assert_eq!(Hosts::single(3).members(0), &[0, 1, 2]);
    }
}
