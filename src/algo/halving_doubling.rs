//! Recursive halving-doubling all-reduce (Rabenseifner): a reduce-scatter by recursive halving
//! — at each of log2 p steps, partners exchange half of their current range and keep reducing
//! the other half — then an all-gather by recursive doubling that retraces the steps. Bytes per
//! rank match the ring's 2(p−1)/p·S, in 2·log2 p rounds instead of 2(p−1).
//!
//! For n not a power of two, with p the largest power of two below n and rem = n − p, the first
//! 2·rem ranks fold in pairs before (even rank sends all its data to the odd one) and unfold
//! after (the odd one sends the result back), leaving p participants.

use std::ops::Range;

use super::{Collective, Gen, Region};

pub(super) fn build(g: &mut Gen) {
    match g.plan.collective {
        Collective::AllReduce => all_reduce(g),
        other => unreachable!("hd does not implement {other}; checked by Algorithm::supports"),
    }
}

/// One recursive-halving step as this rank saw it, kept to retrace it in the all-gather.
struct Level {
    partner: usize,
    keep: Range<usize>,
    give: Range<usize>,
}

fn all_reduce(g: &mut Gen) {
    let (n, r, count, op) = (g.n, g.rank, g.plan.count, g.plan.op);
    if count == 0 {
        return;
    }
    if n == 1 {
        g.b.copy(g.output(0..count), g.input(0..count));
        return;
    }
    let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
    let rem = n - p;
    let all = 0..count;

    // Fold: even ranks below 2·rem hand everything to their odd neighbour and sit out.
    if r < 2 * rem && r % 2 == 0 {
        for sl in g.slices(all.clone()) {
            g.b.send(r + 1, g.input(sl));
        }
        for sl in g.slices(all) {
            g.b.recv(r + 1, g.output(sl));
        }
        return;
    }
    let folded = r < 2 * rem;
    if folded {
        for sl in g.slices(all.clone()) {
            g.b.recv_reduce(r - 1, g.output(sl.clone()), g.input(sl), op);
        }
    }
    let me = if folded { r / 2 } else { r - rem };
    let real = |v: usize| if v < rem { 2 * v + 1 } else { v + rem };

    // Reduce-scatter by recursive halving. Before the first write the current values are the
    // input (unless the fold already wrote the output); after it they are in the output.
    let mut in_output = folded;
    let mut range = all.clone();
    let mut levels = Vec::new();
    let mut mask = p / 2;
    while mask >= 1 {
        let partner = real(me ^ mask);
        let mid = range.start + range.len() / 2;
        let (keep, give) = if me & mask == 0 {
            (range.start..mid, mid..range.end)
        } else {
            (mid..range.end, range.start..mid)
        };
        let current = |g: &Gen, sl: Range<usize>| -> Region {
            if in_output { g.output(sl) } else { g.input(sl) }
        };
        let sends: Vec<_> = g.slices(give.clone()).collect();
        let recvs: Vec<_> = g.slices(keep.clone()).collect();
        for k in 0..sends.len().max(recvs.len()) {
            if let Some(sl) = sends.get(k) {
                let src = current(g, sl.clone());
                g.b.send(partner, src);
            }
            if let Some(sl) = recvs.get(k) {
                let src = current(g, sl.clone());
                g.b.recv_reduce(partner, g.output(sl.clone()), src, op);
            }
        }
        in_output = true;
        levels.push(Level {
            partner,
            keep: keep.clone(),
            give,
        });
        range = keep;
        mask /= 2;
    }
    for sl in g.slices(range) {
        g.b.finish_avg(g.output(sl), op, n);
    }

    // All-gather by recursive doubling: retrace the levels, swapping what each kept.
    for level in levels.iter().rev() {
        let sends: Vec<_> = g.slices(level.keep.clone()).collect();
        let recvs: Vec<_> = g.slices(level.give.clone()).collect();
        for k in 0..sends.len().max(recvs.len()) {
            if let Some(sl) = sends.get(k) {
                g.b.send(level.partner, g.output(sl.clone()));
            }
            if let Some(sl) = recvs.get(k) {
                g.b.recv(level.partner, g.output(sl.clone()));
            }
        }
    }

    // Unfold: give the folded-out neighbour the result.
    if folded {
        for sl in g.slices(all) {
            g.b.send(r - 1, g.output(sl));
        }
    }
}
