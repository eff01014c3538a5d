//! Ring algorithms: all-reduce as reduce-scatter then all-gather, reduce-scatter, all-gather,
//! and the pipelined chain for broadcast and reduce. Each rank talks only to its two ring
//! neighbours; every byte crosses each link the theoretical minimum number of times.

use std::ops::Range;

use super::partition::block;
use super::{Collective, Gen, Region};
use crate::types::Rank;

pub(super) fn build(g: &mut Gen) {
    match g.plan.collective {
        Collective::AllReduce => all_reduce(g),
        Collective::ReduceScatter => reduce_scatter(g),
        Collective::AllGather => all_gather(g),
        Collective::Broadcast => broadcast(g),
        Collective::Reduce => reduce(g),
        other => unreachable!("ring does not implement {other}; checked by Algorithm::supports"),
    }
}

fn neighbours(g: &Gen) -> (usize, usize) {
    ((g.rank + 1) % g.n, (g.rank + g.n - 1) % g.n)
}

/// Ring all-reduce. Reduce-scatter: at step s rank r sends block r−s and reduces block r−s−1
/// into its output, so after n−1 steps it owns block r+1 fully reduced; all-gather then passes
/// the owned blocks around. Partials live in the output at their final place: no scratch.
fn all_reduce(g: &mut Gen) {
    let (n, r, count, op) = (g.n, g.rank, g.plan.count, g.plan.op);
    if count == 0 {
        return;
    }
    let ranks: Vec<Rank> = (0..n).collect();
    // Rank r owns block r+1, so that not every rank starts with block 0.
    let owned = move |c: usize| vec![block(count, n, (c + 1) % n)];
    reduce_scatter_among(g, &ranks, r, &owned);
    for sl in g.slices(block(count, n, (r + 1) % n)) {
        g.b.finish_avg(g.output(sl), op, n);
    }
    all_gather_among(g, &ranks, r, &owned);
}

/// The slices of `ranges`, in order.
fn pieces(g: &Gen, ranges: Vec<Range<usize>>) -> Vec<Range<usize>> {
    ranges.into_iter().flat_map(|r| g.slices(r)).collect()
}

/// Ring reduce-scatter among `ranks` (any ranks, in ring order) (this rank at position `me`): at step s position i sends
/// block i−s−1 and folds block i−s−2 into the output, so the last step completes block i at
/// its place in the output. The first step sends from the input.
pub(super) fn reduce_scatter_among(
    g: &mut Gen,
    ranks: &[Rank],
    me: usize,
    blk: &dyn Fn(usize) -> Vec<Range<usize>>,
) {
    let (m, op) = (ranks.len(), g.plan.op);
    if m == 1 {
        let all = 0..g.plan.count;
        g.b.copy(g.output(all.clone()), g.input(all));
        return;
    }
    let (next, prev) = (ranks[(me + 1) % m], ranks[(me + m - 1) % m]);
    for s in 0..m - 1 {
        let sends = pieces(g, blk(me + 2 * m - s - 1));
        let recvs = pieces(g, blk(me + 2 * m - s - 2));
        for k in 0..sends.len().max(recvs.len()) {
            if let Some(sl) = sends.get(k) {
                let src = if s == 0 {
                    g.input(sl.clone())
                } else {
                    g.output(sl.clone())
                };
                g.b.send(next, src);
            }
            if let Some(sl) = recvs.get(k) {
                g.b.recv_reduce(prev, g.output(sl.clone()), g.input(sl.clone()), op);
            }
        }
    }
}

/// Ring all-gather among `ranks` of the blocks each holds at their place in the output: at
/// step s position i sends block i−s and receives block i−s−1.
pub(super) fn all_gather_among(
    g: &mut Gen,
    ranks: &[Rank],
    me: usize,
    blk: &dyn Fn(usize) -> Vec<Range<usize>>,
) {
    let m = ranks.len();
    if m == 1 {
        return;
    }
    let (next, prev) = (ranks[(me + 1) % m], ranks[(me + m - 1) % m]);
    for s in 0..m - 1 {
        let sends = pieces(g, blk(me + m - s));
        let recvs = pieces(g, blk(me + 2 * m - s - 1));
        for k in 0..sends.len().max(recvs.len()) {
            if let Some(sl) = sends.get(k) {
                g.b.send(next, g.output(sl.clone()));
            }
            if let Some(sl) = recvs.get(k) {
                g.b.recv(prev, g.output(sl.clone()));
            }
        }
    }
}

/// The all-gather half shared by all-reduce and all-gather: at step s rank r sends block
/// r+shift−s (which it owns or just received) and receives block r+shift−s−1 into the output.
/// `at(c)` is block c's element range; `src0` gives the region step 0 sends block r+shift from.
fn gather_ring(
    g: &mut Gen,
    at: impl Fn(usize) -> Range<usize>,
    src0: impl Fn(&Gen, Range<usize>) -> Region,
    shift: usize,
) {
    let (n, r) = (g.n, g.rank);
    let (next, prev) = neighbours(g);
    for s in 0..n - 1 {
        let sends: Vec<_> = g.slices(at((r + shift + n - s) % n)).collect();
        let recvs: Vec<_> = g.slices(at((r + shift + 2 * n - s - 1) % n)).collect();
        for k in 0..sends.len().max(recvs.len()) {
            if let Some(sl) = sends.get(k) {
                let src = if s == 0 {
                    src0(g, sl.clone())
                } else {
                    g.output(sl.clone())
                };
                g.b.send(next, src);
            }
            if let Some(sl) = recvs.get(k) {
                g.b.recv(prev, g.output(sl.clone()));
            }
        }
    }
}

/// Ring all-gather: own block copied into place and sent on; n−1 steps of receive-and-forward.
fn all_gather(g: &mut Gen) {
    let (n, r, count) = (g.n, g.rank, g.plan.count);
    if count == 0 {
        return;
    }
    let at = move |c: usize| c * count..(c + 1) * count;
    // Sending straight from the input lets the copy into the output overlap the first step.
    if n > 1 {
        gather_ring(
            g,
            at,
            |g, sl| g.input(sl.start - r * count..sl.end - r * count),
            0,
        );
    }
    g.b.copy(g.output(at(r)), g.input(0..count));
}

/// Ring reduce-scatter: at step s rank r sends block r−s−1 and reduces block r−s−2, so the
/// last step reduces block r. Out of place, the running partials live in the output (which is
/// exactly one block long) at the same offsets for every step; in place, the output is part of
/// the input and partials live in scratch slots, processed in groups of `scratch_slots` slices
/// so scratch stays bounded.
fn reduce_scatter(g: &mut Gen) {
    let (n, r, count, op) = (g.n, g.rank, g.plan.count, g.plan.op);
    if count == 0 {
        return;
    }
    if n == 1 {
        g.b.copy(g.output(0..count), g.input(0..count));
        return;
    }
    let (next, prev) = neighbours(g);
    let slices: Vec<Range<usize>> = g.slices(0..count).collect();
    let group = if g.plan.in_place {
        g.reserve_scratch();
        g.choice.scratch_slots.max(1)
    } else {
        slices.len()
    };
    for batch in slices.chunks(group) {
        // Where slice k of the current partial lives.
        let mut partial: Vec<Option<Region>> = vec![None; batch.len()];
        for s in 0..n - 1 {
            let send_blk = (r + 2 * n - s - 1) % n;
            let recv_blk = (r + 2 * n - s - 2) % n;
            for (k, sl) in batch.iter().enumerate() {
                let src = match partial[k] {
                    Some(p) => p,
                    None => g.input(send_blk * count + sl.start..send_blk * count + sl.end),
                };
                g.b.send(next, src);
                let dst = if s == n - 2 {
                    g.output(sl.clone())
                } else if g.plan.in_place {
                    g.scratch(sl.len())
                } else {
                    g.output(sl.clone())
                };
                let own = g.input(recv_blk * count + sl.start..recv_blk * count + sl.end);
                g.b.recv_reduce(prev, dst, own, op);
                partial[k] = Some(dst);
            }
        }
        for sl in batch {
            g.b.finish_avg(g.output(sl.clone()), op, n);
        }
    }
}

/// Position of rank `r` along the chain that starts at the root.
fn chain_position(g: &Gen, r: usize) -> usize {
    (r + g.n - g.plan.root) % g.n
}

fn chain_rank(g: &Gen, pos: usize) -> usize {
    (pos + g.plan.root) % g.n
}

/// Pipelined chain broadcast: root → root+1 → ... → root−1, slice by slice.
fn broadcast(g: &mut Gen) {
    let (n, count) = (g.n, g.plan.count);
    if count == 0 {
        return;
    }
    let pos = chain_position(g, g.rank);
    let next = (pos + 1 < n).then(|| chain_rank(g, pos + 1));
    let prev = chain_rank(g, (pos + n - 1) % n);
    for sl in g.slices(0..count) {
        let src = if pos == 0 {
            g.b.copy(g.output(sl.clone()), g.input(sl.clone()));
            g.input(sl.clone())
        } else {
            g.b.recv(prev, g.output(sl.clone()));
            g.output(sl.clone())
        };
        if let Some(next) = next {
            g.b.send(next, src);
        }
    }
}

/// Pipelined chain reduce: root−1 → root−2 → ... → root, each link carrying the running
/// partial. Non-root ranks have no output, so partials live in scratch slots.
fn reduce(g: &mut Gen) {
    let (n, count, op) = (g.n, g.plan.count, g.plan.op);
    if count == 0 {
        return;
    }
    let pos = chain_position(g, g.rank);
    // Data flows from the end of the chain (position n−1) towards the root (position 0).
    let upstream = (pos + 1 < n).then(|| chain_rank(g, pos + 1));
    let downstream = (pos > 0).then(|| chain_rank(g, pos - 1));
    if pos != 0 && upstream.is_some() {
        g.reserve_scratch();
    }
    for sl in g.slices(0..count) {
        let own = g.input(sl.clone());
        let value = match upstream {
            None => own,
            Some(up) => {
                let dst = if pos == 0 {
                    g.output(sl.clone())
                } else {
                    g.scratch(sl.len())
                };
                g.b.recv_reduce(up, dst, own, op);
                dst
            }
        };
        match downstream {
            Some(down) => {
                g.b.send(down, value);
            }
            None => {
                g.b.copy(g.output(sl.clone()), value);
                g.b.finish_avg(g.output(sl), op, n);
            }
        }
    }
}
