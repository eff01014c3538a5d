//! Hierarchical algorithms: a leg inside each host, a leg between hosts, a leg inside each host
//! again — so each byte crosses the slow links between hosts as few times as possible and the
//! fast links inside a host (shared memory) carry the rest. Hosts may hold different numbers
//! of ranks, and a host's ranks need not be numbered together.
//!
//! - All-reduce: a ring reduce-scatter inside each host leaves local rank i of a host with m
//!   ranks that host's partial of block i of m; every element then has one owner per host, and
//!   the owners of each stretch of elements (one per host, a different set per stretch, so every
//!   rank's links between hosts work at once) all-reduce it between hosts with the leg
//!   [`super::Choice::leg`] names ([`super::Algorithm::Ring`] or [`super::Algorithm::Direct`]);
//!   a ring all-gather inside each host finishes. With m ranks on every host, the stretches are
//!   the m blocks.
//! - All-gather: every rank sends its block once to each other host, to the rank there that
//!   owns its column, then a ring all-gather inside each host.
//! - Reduce-scatter: the mirror image: each column's owner folds its host's contributions to
//!   that column's blocks and sends each fold once to the block's rank on another host.
//! - Broadcast: a pipelined chain through one leader per host (the root on its own host, the
//!   lowest rank elsewhere), and from each leader a pipelined chain through its host.
//! - Reduce: the reverse: a chain inside each host to its leader, then a chain of leaders to
//!   the root.
//!
//! Every rank of one all-reduce gets the same bits: each element is folded by one rank inside
//! a host, by one rank (ring) or in host order on each owner (direct) between hosts, and copied
//! from there.

use std::ops::Range;

use super::partition::block;
use super::ring::{all_gather_among, reduce_scatter_among};
use super::{Algorithm, Collective, Gen, Region};
use crate::types::Rank;

pub(super) fn build(g: &mut Gen) {
    match g.plan.collective {
        Collective::AllReduce => all_reduce(g),
        Collective::AllGather => all_gather(g),
        Collective::ReduceScatter => reduce_scatter(g),
        Collective::Broadcast => broadcast(g),
        Collective::Reduce => reduce(g),
        other => {
            unreachable!("hierarchical does not implement {other}; checked by Algorithm::supports")
        }
    }
}

/// A stretch of elements and its owners, one per host, in host order.
struct Stretch {
    range: Range<usize>,
    owners: Vec<Rank>,
}

/// The stretches of `count` elements: the `M` blocks, where M is the most ranks any host has;
/// on a host of m ranks, block i belongs to local rank i mod m (so on hosts of M ranks, rank i
/// owns block i, and on smaller hosts some ranks own more than one). Empty blocks are left out.
fn stretches(g: &Gen, count: usize) -> Vec<Stretch> {
    let hosts = g.hosts;
    let big = hosts.largest();
    (0..big)
        .map(|i| Stretch {
            range: block(count, big, i),
            owners: (0..hosts.count())
                .map(|h| {
                    let ranks = hosts.members(h);
                    ranks[i % ranks.len()]
                })
                .collect(),
        })
        .filter(|s| !s.range.is_empty())
        .collect()
}

fn all_reduce(g: &mut Gen) {
    let (count, op, n) = (g.plan.count, g.plan.op, g.n);
    if count == 0 {
        return;
    }
    let hosts = g.hosts;
    let locals = hosts.members(hosts.host(g.rank));
    let me = hosts.local(g.rank);
    let (m, big) = (locals.len(), hosts.largest());
    // Local rank j's share: blocks j, j + m, j + 2m, ... of the M blocks.
    let share = move |j: usize| -> Vec<Range<usize>> {
        (j % m..big)
            .step_by(m)
            .map(|i| block(count, big, i))
            .collect()
    };
    reduce_scatter_among(g, locals, me, &share);
    let stretches = stretches(g, count);
    let direct = g.choice.leg == Algorithm::Direct;
    if direct
        && stretches.iter().any(|s| {
            s.owners
                .iter()
                .position(|&o| o == g.rank)
                .is_some_and(|j| j > 0)
        })
    {
        g.reserve_scratch();
    }
    for s in &stretches {
        let Some(j) = s.owners.iter().position(|&o| o == g.rank) else {
            continue;
        };
        if direct {
            all_reduce_direct(g, &s.owners, j, s.range.clone());
        } else {
            all_reduce_ring(g, &s.owners, j, s.range.clone());
        }
        for sl in g.slices(s.range.clone()) {
            g.b.finish_avg(g.output(sl), op, n);
        }
    }
    all_gather_among(g, locals, me, &share);
}

/// Ring all-reduce among `ranks` (this rank at position `j`) of elements `range`, which every
/// one of them holds in its output: reduce-scatter of `range` cut in `ranks.len()` blocks, then
/// all-gather.
fn all_reduce_ring(g: &mut Gen, ranks: &[Rank], j: usize, range: Range<usize>) {
    let p = ranks.len();
    if p == 1 {
        return;
    }
    let blk = |c: usize| {
        let b = block(range.len(), p, c % p);
        range.start + b.start..range.start + b.end
    };
    let (next, prev) = (ranks[(j + 1) % p], ranks[(j + p - 1) % p]);
    let op = g.plan.op;
    // At step s position j sends block j−s and folds block j−s−1; it ends owning block j+1.
    for s in 0..p - 1 {
        let sends: Vec<_> = g.slices(blk(j + p - s)).collect();
        let recvs: Vec<_> = g.slices(blk(j + 2 * p - s - 1)).collect();
        for k in 0..sends.len().max(recvs.len()) {
            if let Some(sl) = sends.get(k) {
                g.b.send(next, g.output(sl.clone()));
            }
            if let Some(sl) = recvs.get(k) {
                let dst = g.output(sl.clone());
                g.b.recv_reduce(prev, dst, dst, op);
            }
        }
    }
    all_gather_among(g, ranks, j, &|c| vec![blk(c + 1)]);
}

/// Direct all-reduce among `ranks` (this rank at position `j`) of elements `range` held in
/// every one's output: each sends its part to all the others and folds all of them in position
/// order, slice by slice. Contributions before this rank's own gather in a scratch slot.
fn all_reduce_direct(g: &mut Gen, ranks: &[Rank], j: usize, range: Range<usize>) {
    let (p, op) = (ranks.len(), g.plan.op);
    for sl in g.slices(range) {
        let own = g.output(sl.clone());
        for d in 1..p {
            g.b.send(ranks[(j + d) % p], own);
        }
        if j > 0 {
            let acc = g.scratch(sl.len());
            g.b.recv(ranks[0], acc);
            for &q in &ranks[1..j] {
                g.b.recv_reduce(q, acc, acc, op);
            }
            g.b.reduce(own, acc, own, op);
        }
        for &q in &ranks[j + 1..] {
            g.b.recv_reduce(q, own, own, op);
        }
    }
}

/// Hierarchical all-gather: every rank sends its block straight to one rank on each other
/// host — the owner there of its column (its local index; on a host of m ranks, column i
/// belongs to local rank i mod m) — then each host runs a ring all-gather of what its ranks
/// hold: each its own block and the blocks of its columns from the other hosts. Each block
/// crosses to each other host once.
fn all_gather(g: &mut Gen) {
    let (count, r) = (g.plan.count, g.rank);
    if count == 0 {
        return;
    }
    let hosts = g.hosts;
    let host = hosts.host(r);
    let locals = hosts.members(host);
    let (me, m, big) = (hosts.local(r), locals.len(), hosts.largest());
    let at = move |x: Rank| x * count..(x + 1) * count;
    let others: Vec<usize> = (0..hosts.count()).filter(|&h| h != host).collect();
    let owner = |h: usize, column: usize| hosts.members(h)[column % hosts.members(h).len()];
    for sl in g.slices(0..count) {
        for &h in &others {
            g.b.send(owner(h, me), g.input(sl.clone()));
        }
    }
    // The blocks this rank receives: column i (i ≡ me mod m) of every other host that has
    // such a rank.
    let columns: Vec<usize> = (me..big).step_by(m).collect();
    let from = |h: usize| -> Vec<Rank> {
        let ranks = hosts.members(h);
        columns
            .iter()
            .filter_map(|&i| ranks.get(i).copied())
            .collect()
    };
    for sl in g.slices(0..count) {
        for &h in &others {
            for x in from(h) {
                let block = at(x);
                g.b.recv(x, g.output(block.start + sl.start..block.start + sl.end));
            }
        }
    }
    g.b.copy(g.output(at(r)), g.input(0..count));
    // Local rank k's share: the blocks of column i ≡ k (mod m) on every host.
    let share = move |k: usize| -> Vec<Range<usize>> {
        let mut blocks = Vec::new();
        for i in (k % m..big).step_by(m) {
            for h in 0..hosts.count() {
                if let Some(&x) = hosts.members(h).get(i) {
                    blocks.push(at(x));
                }
            }
        }
        blocks
    };
    all_gather_among(g, locals, me, &share);
}

/// Hierarchical reduce-scatter, the all-gather's mirror: on each host, the owner of a column
/// (local rank i mod m owns column i) folds its host's contributions to the blocks of every
/// rank in that column, and sends each fold to that block's rank on another host; each rank
/// folds its own block: its own contribution, its host's others in local order, then the other
/// hosts' folds in host order. Each block crosses to its rank once from each other host; partial
/// folds live in scratch slots, slice by slice.
fn reduce_scatter(g: &mut Gen) {
    let (count, r, op, n) = (g.plan.count, g.rank, g.plan.op, g.n);
    if count == 0 {
        return;
    }
    let hosts = g.hosts;
    let host = hosts.host(r);
    let locals = hosts.members(host);
    let (me, m, big) = (hosts.local(r), locals.len(), hosts.largest());
    let column_owner = |h: usize, column: usize| {
        let ranks = hosts.members(h);
        ranks[column % ranks.len()]
    };
    // Every rank's block in one order all ranks agree on: by column, then by host.
    let order: Vec<Rank> = (0..big)
        .flat_map(|i| (0..hosts.count()).filter_map(move |h| hosts.members(h).get(i).copied()))
        .collect();
    let at = move |x: Rank, sl: &Range<usize>| x * count + sl.start..x * count + sl.end;
    if m > 1 {
        g.reserve_scratch();
    }
    for sl in g.slices(0..count) {
        // This rank's contributions to the blocks other local ranks fold.
        for &x in &order {
            let owner = column_owner(host, hosts.local(x));
            if owner != r {
                g.b.send(owner, g.input(at(x, &sl)));
            }
        }
        for &x in &order {
            if column_owner(host, hosts.local(x)) != r {
                continue;
            }
            let own = g.input(at(x, &sl));
            let others = locals.iter().copied().filter(|&q| q != r);
            if x == r {
                let out = g.output(sl.clone());
                g.b.copy(out, own);
                for q in others {
                    g.b.recv_reduce(q, out, out, op);
                }
                for h in (0..hosts.count()).filter(|&h| h != host) {
                    g.b.recv_reduce(column_owner(h, me), out, out, op);
                }
                g.b.finish_avg(out, op, n);
            } else {
                let mut value = own;
                if m > 1 {
                    let dst = g.scratch(sl.len());
                    for q in others {
                        g.b.recv_reduce(q, dst, value, op);
                        value = dst;
                    }
                }
                g.b.send(x, value);
            }
        }
    }
}

/// Where this rank sits in the chains of a broadcast or reduce.
struct Chains {
    /// Each host's leader: the root on the root's host, the lowest rank elsewhere.
    leaders: Vec<Rank>,
    /// This rank's host.
    host: usize,
    /// That host's leader.
    leader: Rank,
    /// That host's ranks from the leader on, then the others in rank order after it, wrapping.
    local: Vec<Rank>,
    /// The hosts from the root's on.
    hosts: Vec<usize>,
}

fn chains(g: &Gen) -> Chains {
    let hosts = g.hosts;
    let (hc, root_host) = (hosts.count(), hosts.host(g.plan.root));
    let leaders: Vec<Rank> = (0..hc)
        .map(|h| {
            if h == root_host {
                g.plan.root
            } else {
                hosts.members(h)[0]
            }
        })
        .collect();
    let host = hosts.host(g.rank);
    let leader = leaders[host];
    let ranks = hosts.members(host);
    let at = ranks
        .iter()
        .position(|&r| r == leader)
        .expect("leader is local");
    Chains {
        local: (0..ranks.len())
            .map(|k| ranks[(at + k) % ranks.len()])
            .collect(),
        hosts: (0..hc).map(|k| (root_host + k) % hc).collect(),
        leaders,
        host,
        leader,
    }
}

/// Neighbours of `x` in `chain`: (the one before, the one after).
fn around<T: Copy + PartialEq>(chain: &[T], x: T) -> (Option<T>, Option<T>) {
    let at = chain.iter().position(|&c| c == x).expect("in the chain");
    (
        at.checked_sub(1).map(|i| chain[i]),
        chain.get(at + 1).copied(),
    )
}

fn broadcast(g: &mut Gen) {
    let count = g.plan.count;
    if count == 0 {
        return;
    }
    let Chains {
        leaders,
        host,
        leader,
        local,
        hosts,
    } = chains(g);
    let (local_prev, local_next) = around(&local, g.rank);
    let (host_prev, host_next) = around(&hosts, host);
    for sl in g.slices(0..count) {
        let src = if g.rank == g.plan.root {
            g.b.copy(g.output(sl.clone()), g.input(sl.clone()));
            g.input(sl.clone())
        } else {
            let from = match local_prev {
                Some(p) => p,
                None => leaders[host_prev.expect("only the root's host starts the chain")],
            };
            g.b.recv(from, g.output(sl.clone()));
            g.output(sl.clone())
        };
        if g.rank == leader
            && let Some(h) = host_next
        {
            g.b.send(leaders[h], src);
        }
        if let Some(next) = local_next {
            g.b.send(next, src);
        }
    }
}

fn reduce(g: &mut Gen) {
    let (count, op, n, root) = (g.plan.count, g.plan.op, g.n, g.plan.root);
    if count == 0 {
        return;
    }
    let Chains {
        leaders,
        host,
        leader,
        local,
        hosts,
    } = chains(g);
    // Partials flow against the chains: from a host's last rank to its leader, and from the
    // last host's leader to the root.
    let (local_down, local_up) = around(&local, g.rank);
    let (host_down, host_up) = around(&hosts, host);
    let host_up = host_up.filter(|_| g.rank == leader);
    if g.rank != root && (local_up.is_some() || host_up.is_some()) {
        g.reserve_scratch();
    }
    for sl in g.slices(0..count) {
        let mut value = g.input(sl.clone());
        for up in [local_up, host_up.map(|h| leaders[h])]
            .into_iter()
            .flatten()
        {
            let dst = if g.rank == root {
                g.output(sl.clone())
            } else if value.buffer == super::Buffer::Scratch {
                value
            } else {
                g.scratch(sl.len())
            };
            g.b.recv_reduce(up, dst, value, op);
            value = dst;
        }
        let down = match local_down {
            Some(d) => Some(d),
            None => host_down.map(|h| leaders[h]),
        };
        match down {
            Some(d) => {
                g.b.send(d, value);
            }
            None => {
                let out: Region = g.output(sl.clone());
                g.b.copy(out, value);
                g.b.finish_avg(out, op, n);
            }
        }
    }
}
