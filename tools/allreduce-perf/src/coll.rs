//! The collectives the benchmark measures, as nccl-tests names and sizes them: the name of each
//! `*_perf` test, how a row's size in bytes becomes element counts, and the bus-bandwidth factor.
//! Pure arithmetic; nothing here talks to a communicator.

use std::fmt;

use oxccl::algo::Collective;

/// One collective under test (oxccl's collectives plus send/receive in a ring).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coll {
    /// All-reduce.
    AllReduce,
    /// All-gather.
    AllGather,
    /// Reduce-scatter.
    ReduceScatter,
    /// Broadcast from the root.
    Broadcast,
    /// Reduce to the root.
    Reduce,
    /// All-to-all.
    AllToAll,
    /// Gather to the root.
    Gather,
    /// Scatter from the root.
    Scatter,
    /// Every rank sends to rank + 1 and receives from rank − 1 in one group.
    SendRecv,
}

impl Coll {
    /// Every collective, in the order `--help` lists them.
    pub const ALL: [Coll; 9] = [
        Coll::AllReduce,
        Coll::AllGather,
        Coll::ReduceScatter,
        Coll::Broadcast,
        Coll::Reduce,
        Coll::AllToAll,
        Coll::Gather,
        Coll::Scatter,
        Coll::SendRecv,
    ];

    /// Parses a collective name, ignoring case, `_` and `-` (`allreduce`, `all_reduce`,
    /// `all-to-all`, `send_recv`); `None` when `s` names none.
    pub fn parse(s: &str) -> Option<Coll> {
        let key: String = s
            .chars()
            .filter(|c| *c != '_' && *c != '-')
            .map(|c| c.to_ascii_lowercase())
            .collect();
        Coll::ALL
            .into_iter()
            .find(|c| c.name().replace('_', "") == key)
    }

    /// nccl-tests' name (`all_reduce`, `alltoall`, `sendrecv`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce",
            Coll::AllGather => "all_gather",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::Broadcast => "broadcast",
            Coll::Reduce => "reduce",
            Coll::AllToAll => "alltoall",
            Coll::Gather => "gather",
            Coll::Scatter => "scatter",
            Coll::SendRecv => "sendrecv",
        }
    }

    /// The oxccl collective, `None` for send/receive (point-to-point, no plan).
    pub const fn collective(self) -> Option<Collective> {
        Some(match self {
            Coll::AllReduce => Collective::AllReduce,
            Coll::AllGather => Collective::AllGather,
            Coll::ReduceScatter => Collective::ReduceScatter,
            Coll::Broadcast => Collective::Broadcast,
            Coll::Reduce => Collective::Reduce,
            Coll::AllToAll => Collective::AllToAll,
            Coll::Gather => Collective::Gather,
            Coll::Scatter => Collective::Scatter,
            Coll::SendRecv => return None,
        })
    }

    /// Whether the collective combines values with a reduction operator.
    pub const fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce)
    }

    /// Whether the collective has a root.
    pub const fn rooted(self) -> bool {
        matches!(
            self,
            Coll::Broadcast | Coll::Reduce | Coll::Gather | Coll::Scatter
        )
    }

    /// Whether oxccl's API has an in-place form. Gather, scatter and send/receive have none
    /// (a buffer cannot be lent as both input and output), so their in-place columns read N/A.
    pub const fn has_in_place(self) -> bool {
        !matches!(self, Coll::Gather | Coll::Scatter | Coll::SendRecv)
    }

    /// Whether the row's array is split in n per-rank blocks (so sizes round down to a multiple
    /// of n elements).
    const fn splits(self) -> bool {
        matches!(
            self,
            Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll | Coll::Gather | Coll::Scatter
        )
    }

    /// For a row of `size` bytes of `elem_size`-byte elements on `n` ranks: (elements of the
    /// whole logical array, the count passed to the collective). As in nccl-tests the size
    /// column is the whole array and the count column is the collective's count argument: the
    /// per-rank block where the array is split in n blocks.
    pub fn counts(self, size: u64, elem_size: usize, n: usize) -> (usize, usize) {
        let elements = usize::try_from(size / elem_size as u64).unwrap_or(usize::MAX);
        if self.splits() {
            let per_rank = elements / n.max(1);
            (per_rank * n, per_rank)
        } else {
            (elements, elements)
        }
    }

    /// nccl-tests' bus-bandwidth factor on `n` ranks: busbw = algbw × factor.
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n.max(1) as f64;
        match self {
            Coll::AllReduce => 2.0 * (n - 1.0) / n,
            Coll::ReduceScatter
            | Coll::AllGather
            | Coll::AllToAll
            | Coll::Gather
            | Coll::Scatter => (n - 1.0) / n,
            Coll::Broadcast | Coll::Reduce | Coll::SendRecv => 1.0,
        }
    }
}

impl fmt::Display for Coll {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_with_or_without_separators() {
        for c in Coll::ALL {
            assert_eq!(Coll::parse(c.name()), Some(c));
            assert_eq!(Coll::parse(&c.name().replace('_', "")), Some(c));
        }
        assert_eq!(Coll::parse("AllReduce"), Some(Coll::AllReduce));
        assert_eq!(Coll::parse("all-to-all"), Some(Coll::AllToAll));
        assert_eq!(Coll::parse("all_to_all"), Some(Coll::AllToAll));
        assert_eq!(Coll::parse("send_recv"), Some(Coll::SendRecv));
        assert_eq!(Coll::parse("sum"), None);
        assert_eq!(Coll::parse("barrier"), None);
    }

    #[test]
    fn split_collectives_round_down_to_whole_blocks() {
        assert_eq!(Coll::AllReduce.counts(100, 4, 3), (25, 25));
        assert_eq!(Coll::AllGather.counts(100, 4, 3), (24, 8));
        assert_eq!(Coll::AllToAll.counts(8, 4, 3), (0, 0));
        assert_eq!(Coll::SendRecv.counts(7, 2, 3), (3, 3));
    }

    #[test]
    fn bus_factors_follow_nccl_tests() {
        assert_eq!(Coll::AllReduce.bus_factor(4), 1.5);
        assert_eq!(Coll::AllGather.bus_factor(4), 0.75);
        assert_eq!(Coll::Broadcast.bus_factor(4), 1.0);
        assert_eq!(Coll::AllReduce.bus_factor(1), 0.0);
    }
}
