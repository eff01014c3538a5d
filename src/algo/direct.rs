//! Direct algorithms: every rank exchanges with each rank it needs in one hop. Fewest rounds,
//! most messages — the right choice for small messages and for all-to-all, gather and scatter,
//! whose data is different for every peer anyway.
//!
//! Reductions fold contributions in rank order 0, 1, ..., n−1 wherever they are computed, so a
//! one-shot all-reduce gives every rank the same bits even for floats.

use std::ops::Range;

use super::{Buffer, Collective, Gen, Op, Region};

pub(super) fn build(g: &mut Gen) {
    match g.plan.collective {
        Collective::AllReduce => all_reduce(g),
        Collective::Reduce => reduce(g),
        Collective::ReduceScatter => reduce_scatter(g),
        Collective::AllGather => all_gather(g),
        Collective::Broadcast => broadcast(g),
        Collective::Gather => gather(g),
        Collective::Scatter => scatter(g),
        Collective::AllToAll => all_to_all(g),
        Collective::Barrier => barrier(g),
    }
}

/// Peers in the order this rank addresses them: r+1, r+2, ..., so that not every rank starts
/// with rank 0.
fn peers(g: &Gen) -> impl Iterator<Item = usize> + use<> {
    let (n, r) = (g.n, g.rank);
    (1..n).map(move |d| (r + d) % n)
}

/// Folds every rank's contribution to one slice into `dst`, in rank order: contribution j is a
/// message from rank j, except this rank's own, which is the local region `own`. When `dst`
/// is `own` (in place) and this rank is not first, the contributions before it are gathered
/// in a scratch slot so the left-to-right order is kept.
fn fold_in_rank_order(g: &mut Gen, dst: Region, own: Region) {
    let (n, r, op) = (g.n, g.rank, g.plan.op);
    let acc_region = if dst == own && r > 0 {
        g.scratch(dst.len / g.plan.dtype.size())
    } else {
        dst
    };
    let mut acc: Option<Region> = None;
    for j in 0..n {
        if j == r {
            acc = Some(match acc {
                None => own,
                Some(a) => {
                    g.b.reduce(dst, a, own, op);
                    dst
                }
            });
        } else {
            let target = if acc == Some(dst) || j > r {
                dst
            } else {
                acc_region
            };
            match acc {
                None => {
                    g.b.recv(j, target);
                }
                Some(a) => {
                    g.b.recv_reduce(j, target, a, op);
                }
            }
            acc = Some(target);
        }
    }
    let last = acc.expect("n >= 1 contributions");
    g.b.copy(dst, last);
}

/// Whether a fold on this rank needs a scratch slot (in place, not first in rank order).
fn fold_needs_scratch(g: &Gen) -> bool {
    g.plan.in_place && g.rank > 0
}

/// One-shot all-reduce: every rank sends its input to every other rank and folds all n
/// contributions itself.
fn all_reduce(g: &mut Gen) {
    let (n, count, op) = (g.n, g.plan.count, g.plan.op);
    if count == 0 {
        return;
    }
    if fold_needs_scratch(g) {
        g.reserve_scratch();
    }
    for sl in g.slices(0..count) {
        for p in peers(g) {
            g.b.send(p, g.input(sl.clone()));
        }
        fold_in_rank_order(g, g.output(sl.clone()), g.input(sl.clone()));
        g.b.finish_avg(g.output(sl), op, n);
    }
}

/// Flat reduce: every rank sends its input to the root, which folds them in rank order.
fn reduce(g: &mut Gen) {
    let (n, count, op, root) = (g.n, g.plan.count, g.plan.op, g.plan.root);
    if count == 0 {
        return;
    }
    if g.rank == root && fold_needs_scratch(g) {
        g.reserve_scratch();
    }
    for sl in g.slices(0..count) {
        if g.rank == root {
            fold_in_rank_order(g, g.output(sl.clone()), g.input(sl.clone()));
            g.b.finish_avg(g.output(sl), op, n);
        } else {
            g.b.send(root, g.input(sl));
        }
    }
}

/// Pairwise reduce-scatter: block j of every input goes straight to rank j, which folds them.
fn reduce_scatter(g: &mut Gen) {
    let (n, r, count, op) = (g.n, g.rank, g.plan.count, g.plan.op);
    if count == 0 {
        return;
    }
    if fold_needs_scratch(g) {
        g.reserve_scratch();
    }
    let at = |j: usize, sl: &Range<usize>| j * count + sl.start..j * count + sl.end;
    for sl in g.slices(0..count) {
        for p in peers(g) {
            g.b.send(p, g.input(at(p, &sl)));
        }
        fold_in_rank_order(g, g.output(sl.clone()), g.input(at(r, &sl)));
        g.b.finish_avg(g.output(sl), op, n);
    }
}

/// Flat all-gather: every rank sends its input to every other rank.
fn all_gather(g: &mut Gen) {
    let (r, count) = (g.rank, g.plan.count);
    if count == 0 {
        return;
    }
    let at = |j: usize, sl: &Range<usize>| j * count + sl.start..j * count + sl.end;
    for sl in g.slices(0..count) {
        for p in peers(g) {
            g.b.send(p, g.input(sl.clone()));
        }
        for p in peers(g) {
            g.b.recv(p, g.output(at(p, &sl)));
        }
        g.b.copy(g.output(at(r, &sl)), g.input(sl));
    }
}

/// Flat broadcast: the root sends to everyone.
fn broadcast(g: &mut Gen) {
    let (count, root) = (g.plan.count, g.plan.root);
    if count == 0 {
        return;
    }
    for sl in g.slices(0..count) {
        if g.rank == root {
            for p in peers(g) {
                g.b.send(p, g.input(sl.clone()));
            }
            g.b.copy(g.output(sl.clone()), g.input(sl));
        } else {
            g.b.recv(root, g.output(sl));
        }
    }
}

/// Flat gather: everyone sends to the root, which places block j at j·count.
fn gather(g: &mut Gen) {
    let (count, root) = (g.plan.count, g.plan.root);
    if count == 0 {
        return;
    }
    let at = |j: usize, sl: &Range<usize>| j * count + sl.start..j * count + sl.end;
    for sl in g.slices(0..count) {
        if g.rank == root {
            for p in peers(g) {
                g.b.recv(p, g.output(at(p, &sl)));
            }
            g.b.copy(g.output(at(root, &sl)), g.input(sl));
        } else {
            g.b.send(root, g.input(sl));
        }
    }
}

/// Flat scatter: the root sends block j to rank j.
fn scatter(g: &mut Gen) {
    let (count, root) = (g.plan.count, g.plan.root);
    if count == 0 {
        return;
    }
    let at = |j: usize, sl: &Range<usize>| j * count + sl.start..j * count + sl.end;
    for sl in g.slices(0..count) {
        if g.rank == root {
            for p in peers(g) {
                g.b.send(p, g.input(at(p, &sl)));
            }
            g.b.copy(g.output(sl.clone()), g.input(at(root, &sl)));
        } else {
            g.b.recv(root, g.output(sl));
        }
    }
}

/// Pairwise all-to-all: at step s, rank r exchanges with (s − r) mod n, an involution, so both
/// ends of every exchange are in the same step. In place, a received block goes through a
/// scratch slot and is copied over the block just sent to that peer.
fn all_to_all(g: &mut Gen) {
    let (n, r, count) = (g.n, g.rank, g.plan.count);
    if count == 0 {
        return;
    }
    if g.plan.in_place {
        g.reserve_scratch();
    }
    let at = |j: usize, sl: &Range<usize>| j * count + sl.start..j * count + sl.end;
    for s in 0..n {
        let p = (s + n - r % n) % n;
        for sl in g.slices(0..count) {
            if p == r {
                g.b.copy(g.output(at(r, &sl)), g.input(at(r, &sl)));
                continue;
            }
            g.b.send(p, g.input(at(p, &sl)));
            if g.plan.in_place {
                let tmp = g.scratch(sl.len());
                g.b.recv(p, tmp);
                g.b.copy(g.output(at(p, &sl)), tmp);
            } else {
                g.b.recv(p, g.output(at(p, &sl)));
            }
        }
    }
}

/// Dissemination barrier: in round k rank r signals r + 2^k and waits for r − 2^k; after
/// ceil(log2 n) rounds every rank has heard, transitively, from every other.
fn barrier(g: &mut Gen) {
    let (n, r) = (g.n, g.rank);
    let empty = Region::new(Buffer::Input, 0, 0);
    let mut heard = None;
    let mut d = 1;
    while d < n {
        let deps: Vec<_> = heard.into_iter().collect();
        g.b.push(
            Op::Send {
                to: (r + d) % n,
                src: empty,
            },
            &deps,
        );
        heard = Some(g.b.push(
            Op::Recv {
                from: (r + n - d) % n,
                dst: empty,
            },
            &deps,
        ));
        d *= 2;
    }
}
