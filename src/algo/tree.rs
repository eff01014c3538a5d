//! Tree algorithms: binomial broadcast and reduce (log2 n rounds, largest subtree first), and the
//! double binary tree all-reduce in the manner of NCCL: the data is split in two halves, each
//! reduced up and broadcast down its own binary tree; every rank is an inner node in at most one
//! of the two trees, so no rank carries more than its share.

use super::partition::block;
use super::{Collective, Gen, Region};

pub(super) fn build(g: &mut Gen) {
    match g.plan.collective {
        Collective::AllReduce => double_tree_all_reduce(g),
        Collective::Broadcast => binomial_broadcast(g),
        Collective::Reduce => binomial_reduce(g),
        other => unreachable!("tree does not implement {other}; checked by Algorithm::supports"),
    }
}

/// Binomial tree over relative ranks `v = (rank − root) mod n`: the parent of `v > 0` is `v`
/// with its lowest set bit cleared; the children of `v` are `v + 2^j` for every `2^j` below
/// `v`'s lowest set bit (all of them for the root), largest first.
pub(crate) struct Binomial {
    pub parent: Option<usize>,
    /// Children, largest subtree first.
    pub children: Vec<usize>,
}

pub(crate) fn binomial(rank: usize, root: usize, n: usize) -> Binomial {
    let v = (rank + n - root) % n;
    let to_rank = |u: usize| (u + root) % n;
    let low = if v == 0 {
        usize::MAX
    } else {
        v & v.wrapping_neg()
    };
    let parent = (v != 0).then(|| to_rank(v - low));
    let mut children = Vec::new();
    let mut mask = 1usize;
    while mask < n && mask < low {
        if v + mask < n {
            children.push(to_rank(v + mask));
        }
        mask <<= 1;
    }
    children.reverse();
    Binomial { parent, children }
}

fn binomial_broadcast(g: &mut Gen) {
    let count = g.plan.count;
    if count == 0 {
        return;
    }
    let t = binomial(g.rank, g.plan.root, g.n);
    for sl in g.slices(0..count) {
        let src = match t.parent {
            None => {
                g.b.copy(g.output(sl.clone()), g.input(sl.clone()));
                g.input(sl)
            }
            Some(p) => {
                g.b.recv(p, g.output(sl.clone()));
                g.output(sl)
            }
        };
        for &c in &t.children {
            g.b.send(c, src);
        }
    }
}

/// Binomial reduce: each rank folds its children's partials (smallest subtree first, so the
/// earliest to finish is consumed first) into its own and passes the result to its parent.
/// Inner non-root ranks have no output, so their partials live in scratch slots.
fn binomial_reduce(g: &mut Gen) {
    let (count, op, n) = (g.plan.count, g.plan.op, g.n);
    if count == 0 {
        return;
    }
    let t = binomial(g.rank, g.plan.root, n);
    if t.parent.is_some() && !t.children.is_empty() {
        g.reserve_scratch();
    }
    for sl in g.slices(0..count) {
        let mut acc = g.input(sl.clone());
        if !t.children.is_empty() {
            let dst = if t.parent.is_none() {
                g.output(sl.clone())
            } else {
                g.scratch(sl.len())
            };
            for &c in t.children.iter().rev() {
                g.b.recv_reduce(c, dst, acc, op);
                acc = dst;
            }
        }
        match t.parent {
            Some(p) => {
                g.b.send(p, acc);
            }
            None => {
                g.b.copy(g.output(sl.clone()), acc);
                g.b.finish_avg(g.output(sl), op, n);
            }
        }
    }
}

/// One binary tree of the double binary tree, seen from one rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BinaryTree {
    pub parent: Option<usize>,
    /// At most two children: the left one first.
    pub children: Vec<usize>,
}

/// Node `label` (1-based) of the in-order binary tree over labels `1..=m`: a label's level is
/// its number of trailing zeros; the left child of `x` is `x − b/2` (b = lowest set bit of x);
/// the right child is the first of `x + b/2, x + b/4, ...` that is at most `m`. The root is the
/// largest power of two ≤ m.
fn in_order_children(x: usize, m: usize) -> Vec<usize> {
    let b = x & x.wrapping_neg();
    let mut out = Vec::with_capacity(2);
    if b >= 2 {
        out.push(x - b / 2);
        let mut d = b / 2;
        while d >= 1 {
            if x + d <= m {
                out.push(x + d);
                break;
            }
            d /= 2;
        }
    }
    out
}

/// The parent of label `x` in the tree of [`in_order_children`]: climb the perfect tree's
/// parents until one is at most `m`.
fn in_order_parent(x: usize, m: usize) -> Option<usize> {
    let root = 1usize << (usize::BITS - 1 - m.leading_zeros());
    if x == root {
        return None;
    }
    let mut p = x;
    loop {
        let b = p & p.wrapping_neg();
        p = if p & (2 * b) != 0 { p - b } else { p + b };
        if p <= m {
            return Some(p);
        }
    }
}

/// Tree `t` (0 or 1) of the double binary tree on `n ≥ 2` ranks, seen from `rank`. Tree 0
/// puts rank r at label r+1; tree 1 is tree 0 shifted by one rank (label r, and n for rank 0).
/// Inner nodes have even labels, so tree 0's are the odd ranks and tree 1's the even ranks.
pub(crate) fn double_tree(rank: usize, n: usize, t: usize) -> BinaryTree {
    let label_of = |r: usize| {
        if t == 0 {
            r + 1
        } else if r == 0 {
            n
        } else {
            r
        }
    };
    let rank_of = |l: usize| {
        if t == 0 {
            l - 1
        } else if l == n {
            0
        } else {
            l
        }
    };
    let x = label_of(rank);
    BinaryTree {
        parent: in_order_parent(x, n).map(rank_of),
        children: in_order_children(x, n).into_iter().map(rank_of).collect(),
    }
}

/// Double binary tree all-reduce. Half t of the data goes up tree t (children's partials folded
/// into the output in child order) and the root's result comes back down. The broadcast of
/// slice k is emitted `lag` slices after its reduction so that, on a link used by one tree
/// going up and the other coming down, the up-stream never waits for the down-stream.
fn double_tree_all_reduce(g: &mut Gen) {
    let (n, count) = (g.n, g.plan.count);
    if count == 0 {
        return;
    }
    if n == 1 {
        g.b.copy(g.output(0..count), g.input(0..count));
        return;
    }
    let trees = [double_tree(g.rank, n, 0), double_tree(g.rank, n, 1)];
    let halves = [block(count, 2, 0), block(count, 2, 1)];
    let slices: [Vec<_>; 2] = [
        g.slices(halves[0].clone()).collect(),
        g.slices(halves[1].clone()).collect(),
    ];
    let steps = slices[0].len().max(slices[1].len());
    let depth = usize::BITS - n.leading_zeros();
    let lag = 2 * depth as usize + 2;
    for i in 0..steps + lag {
        for t in 0..2 {
            if let Some(sl) = slices[t].get(i) {
                up(g, &trees[t], sl.clone());
            }
        }
        for t in 0..2 {
            if let Some(sl) = i.checked_sub(lag).and_then(|k| slices[t].get(k)) {
                down(g, &trees[t], sl.clone());
            }
        }
    }
}

fn up(g: &mut Gen, tree: &BinaryTree, sl: std::ops::Range<usize>) {
    let op = g.plan.op;
    let mut acc: Region = g.input(sl.clone());
    for &c in &tree.children {
        let dst = g.output(sl.clone());
        g.b.recv_reduce(c, dst, acc, op);
        acc = dst;
    }
    match tree.parent {
        Some(p) => {
            g.b.send(p, acc);
        }
        None => {
            g.b.finish_avg(acc, op, g.n);
        }
    }
}

fn down(g: &mut Gen, tree: &BinaryTree, sl: std::ops::Range<usize>) {
    let out = g.output(sl);
    if let Some(p) = tree.parent {
        g.b.recv(p, out);
    }
    for &c in &tree.children {
        g.b.send(c, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rank but the root has one parent that lists it as a child; the tree spans all ranks.
    fn check_tree(n: usize, node: impl Fn(usize) -> (Option<usize>, Vec<usize>)) {
        let mut roots = 0;
        let mut seen = vec![0; n];
        for r in 0..n {
            let (parent, children) = node(r);
            match parent {
                None => roots += 1,
                Some(p) => {
                    assert!(node(p).1.contains(&r), "n={n}: {p} does not list child {r}");
                }
            }
            for c in children {
                assert_eq!(
                    node(c).0,
                    Some(r),
                    "n={n}: child {c} of {r} has another parent"
                );
                seen[c] += 1;
            }
        }
        assert_eq!(roots, 1, "n={n}");
        assert_eq!(seen.iter().filter(|&&s| s == 1).count(), n - 1, "n={n}");
    }

    #[test]
    fn binomial_trees_span_every_rank_from_every_root() {
        for n in 1..70 {
            for root in [0, n / 2, n - 1] {
                check_tree(n, |r| {
                    let t = binomial(r, root, n);
                    (t.parent, t.children)
                });
            }
        }
    }

    #[test]
    fn double_trees_span_and_share_no_inner_node() {
        for n in 2..300 {
            for t in 0..2 {
                check_tree(n, |r| {
                    let b = double_tree(r, n, t);
                    assert!(b.children.len() <= 2);
                    (b.parent, b.children)
                });
            }
            for r in 0..n {
                let inner = (0..2)
                    .filter(|&t| !double_tree(r, n, t).children.is_empty())
                    .count();
                assert!(inner <= 1, "n={n}: rank {r} is inner in both trees");
            }
            // Depth is logarithmic.
            for t in 0..2 {
                for r in 0..n {
                    let mut d = 0;
                    let mut x = r;
                    while let Some(p) = double_tree(x, n, t).parent {
                        x = p;
                        d += 1;
                    }
                    assert!(d <= 2 * (usize::BITS - n.leading_zeros()) as usize);
                }
            }
        }
    }
}
