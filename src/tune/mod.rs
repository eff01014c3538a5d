//! Algorithm choice: from a plan, the communicator size and the topology to a [`Choice`].
//!
//! For now a small size rule taken from the α-β table in `docs/cost-model.md` (halving-doubling
//! or one-shot for small all-reduces, ring for large; trees for small rooted collectives, the
//! pipelined chain for large ones); the measured cost model replaces it later. `OXCCL_ALGO`
//! forces an algorithm wherever that algorithm implements the collective.

use crate::algo::{Algorithm, Choice, Collective, Plan};
use crate::config::Config;
use crate::topo::Topology;

/// The algorithm and slicing for `plan` on this communicator, and a line saying why.
pub fn choose(plan: &Plan, topo: &Topology, config: &Config) -> (Choice, &'static str) {
    let n = topo.nranks();
    let bytes = plan.count * plan.dtype.size();
    let (algorithm, why) = match config.algorithm {
        Some(a) if a.supports(plan.collective) => (a, "forced by OXCCL_ALGO"),
        _ => default_algorithm(plan.collective, bytes, n),
    };
    let choice = Choice::new(algorithm)
        .slice_bytes(config.slice_bytes)
        .scratch_slots(config.scratch_slots);
    (choice, why)
}

fn default_algorithm(collective: Collective, bytes: usize, n: usize) -> (Algorithm, &'static str) {
    match collective {
        Collective::AllReduce if n <= 2 && bytes <= 64 << 10 => (
            Algorithm::Direct,
            "one-shot: one exchange is the least latency for 2 ranks",
        ),
        Collective::AllReduce if n <= 8 && bytes <= 4 << 10 => {
            (Algorithm::Direct, "one-shot: few ranks, tiny message")
        }
        Collective::AllReduce if bytes <= 1 << 20 => (
            Algorithm::HalvingDoubling,
            "halving-doubling: latency-bound size",
        ),
        Collective::AllReduce => (Algorithm::Ring, "ring: bandwidth-bound size"),
        Collective::Broadcast | Collective::Reduce if bytes <= 256 << 10 => {
            (Algorithm::Tree, "binomial tree: latency-bound size")
        }
        Collective::Broadcast | Collective::Reduce => {
            (Algorithm::Ring, "pipelined chain: bandwidth-bound size")
        }
        Collective::AllGather | Collective::ReduceScatter if n <= 4 && bytes <= 16 << 10 => {
            (Algorithm::Direct, "direct: few ranks, small blocks")
        }
        Collective::AllGather | Collective::ReduceScatter => (Algorithm::Ring, "ring"),
        Collective::Gather | Collective::Scatter | Collective::AllToAll | Collective::Barrier => {
            (Algorithm::Direct, "direct: the only algorithm")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::DataType;

    #[test]
    fn every_choice_supports_its_collective_and_forcing_applies_where_valid() {
        let topo = Topology {
            hosts: vec!["h".into(); 5],
        };
        for c in Collective::ALL {
            for count in [0, 1, 1000, 10_000_000] {
                let plan = Plan::new(c, count, DataType::F32);
                let (choice, _) = choose(&plan, &topo, &Config::default());
                assert!(choice.algorithm.supports(c), "{c} -> {}", choice.algorithm);
                let forced = Config::default().algorithm(Some(Algorithm::Tree));
                let (choice, _) = choose(&plan, &topo, &forced);
                assert!(choice.algorithm.supports(c));
                if Algorithm::Tree.supports(c) {
                    assert_eq!(choice.algorithm, Algorithm::Tree);
                }
            }
        }
    }
}
