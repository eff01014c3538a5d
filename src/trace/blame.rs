//! Who a job waits for, read from its ranks' flight-recorder dumps: one line per
//! communicator. The rules, in order:
//!
//! 1. Ranks that called different things at the same sequence number (the lowest such):
//!    `rank 1 called broadcast #17 where the others called all_reduce`.
//! 2. The lowest collective some rank did not finish. Ranks that never called it (no entry,
//!    or no dump at all), or called it only after the others had given up:
//!    `rank 3 never called all_reduce #1042; ranks 0–2 wait for it`.
//! 3. Everyone called it: follow who waits for whom to the rank at the end of the chain,
//!    and say what that rank did (failed, finished, left no dump).
//!
//! Times across hosts compare wall clocks, so rule 2's "only after" assumes clocks agree to
//! well within the job's timeout.

use std::collections::{BTreeMap, BTreeSet};

use super::{CallKind, CallState, Trace, TraceEntry};
use crate::types::Rank;

/// One line per communicator found in `traces` (their tags first): who its ranks wait for.
pub fn blame(traces: &[Trace]) -> Vec<(String, String)> {
    let mut comms: BTreeMap<&str, Vec<&Trace>> = BTreeMap::new();
    for t in traces {
        comms.entry(&t.comm).or_default().push(t);
    }
    comms
        .into_iter()
        .map(|(comm, ts)| (comm.to_string(), one(&ts)))
        .collect()
}

/// `rank 3`, `ranks 0–2`, `ranks 0, 2–4`.
pub(crate) fn ranks(v: &[Rank]) -> String {
    if v.is_empty() {
        return "no rank".into();
    }
    let mut v = v.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        if j >= i + 2 {
            parts.push(format!("{}–{}", v[i], v[j]));
            i = j + 1;
        } else {
            parts.push(v[i].to_string());
            i += 1;
        }
    }
    let word = if v.len() == 1 { "rank" } else { "ranks" };
    format!("{word} {}", parts.join(", "))
}

/// What a collective call is, for comparing ranks' calls.
fn signature(e: &TraceEntry) -> (Option<&str>, Option<&str>, u64, Option<&str>, Option<Rank>) {
    (
        e.collective.as_deref(),
        e.dtype.as_deref(),
        e.count,
        e.op.as_deref(),
        e.root,
    )
}

/// The fields in which `a` differs from `b`: `count 10`, `float16`, `root 2`, `op max`.
fn differences(a: &TraceEntry, b: &TraceEntry) -> String {
    let mut d = Vec::new();
    if a.dtype != b.dtype {
        d.push(a.dtype.clone().unwrap_or_default());
    }
    if a.count != b.count {
        d.push(format!("count {}", a.count));
    }
    if a.op != b.op {
        d.push(format!("op {}", a.op.clone().unwrap_or_default()));
    }
    if a.root != b.root {
        d.push(format!("root {}", a.root.unwrap_or_default()));
    }
    d.join(", ")
}

struct Rank_<'a> {
    trace: &'a Trace,
    /// Collective entries by sequence number.
    calls: BTreeMap<u64, &'a TraceEntry>,
}

impl Rank_<'_> {
    /// Whether the dump would hold collective `seq` had this rank called it (the ring may
    /// have dropped older calls).
    fn would_hold(&self, seq: u64) -> bool {
        self.trace.recorded <= self.trace.entries.len() as u64
            || self.calls.keys().next().is_some_and(|&first| seq >= first)
    }

    fn unix(&self, ns: u64) -> u128 {
        u128::from(self.trace.start_unix_ns) + u128::from(ns)
    }
}

/// Most ranks a communicator of dumps is taken to have (a dump is a file anyone may have
/// edited: its `size` is not trusted further).
const MAX_SIZE: usize = 1 << 20;

fn one(traces: &[&Trace]) -> String {
    let traces: Vec<&Trace> = traces
        .iter()
        .copied()
        .filter(|t| t.rank < t.size.min(MAX_SIZE))
        .collect();
    let size = traces
        .iter()
        .map(|t| t.size)
        .max()
        .unwrap_or(0)
        .min(MAX_SIZE);
    let mut by_rank: BTreeMap<Rank, Rank_<'_>> = BTreeMap::new();
    for t in traces {
        // Two dumps of one rank (a signal, then a failure): the later one.
        if by_rank.get(&t.rank).is_some_and(|o| {
            o.unix(o.trace.dumped_ns) > u128::from(t.start_unix_ns) + u128::from(t.dumped_ns)
        }) {
            continue;
        }
        let calls = t
            .entries
            .iter()
            .filter(|e| e.kind == CallKind::Collective)
            .map(|e| (e.seq, e))
            .collect();
        by_rank.insert(t.rank, Rank_ { trace: t, calls });
    }
    if let Some(line) = mismatch(&by_rank) {
        return line;
    }
    // The lowest collective some rank did not finish.
    let stuck = by_rank
        .values()
        .filter_map(|r| r.calls.values().find(|e| e.state != CallState::Done))
        .min_by_key(|e| e.seq);
    let Some(stuck) = stuck else {
        return point_to_point(&by_rank).unwrap_or_else(|| {
            format!(
                "every call recorded by {} finished{}",
                ranks(&by_rank.keys().copied().collect::<Vec<_>>()),
                no_dump(&by_rank, size)
            )
        });
    };
    let seq = stuck.seq;
    let name = stuck.name();
    let waiters: Vec<Rank> = by_rank
        .iter()
        .filter(|(_, r)| {
            r.calls
                .get(&seq)
                .is_some_and(|e| !e.ended() || e.state == CallState::Failed)
        })
        .map(|(&k, _)| k)
        .collect();
    // When the first waiter gave up.
    let gave_up = waiters
        .iter()
        .filter_map(|w| {
            let r = by_rank.get(w)?;
            let e = r.calls.get(&seq)?;
            (e.state == CallState::Failed)
                .then(|| e.end_ns.or(e.begin_ns).map(|t| r.unix(t)))
                .flatten()
        })
        .min();
    let mut absent = Vec::new();
    let mut late = Vec::new();
    let mut silent = Vec::new();
    for rank in 0..size {
        match by_rank.get(&rank) {
            None => silent.push(rank),
            Some(r) => match r.calls.get(&seq) {
                None if r.would_hold(seq) => absent.push(rank),
                // A lane call that never waited has no begin time: it was not late (it found
                // everybody there).
                Some(e) if gave_up.is_some_and(|g| e.begin_ns.is_some_and(|b| r.unix(b) > g)) => {
                    late.push(rank)
                }
                _ => {}
            },
        }
    }
    let waiting: Vec<Rank> = waiters
        .iter()
        .copied()
        .filter(|w| !late.contains(w))
        .collect();
    // Ranks without a dump that the waiters' failures name: they failed (died) rather than
    // stayed away.
    let died: Vec<Rank> = silent
        .iter()
        .copied()
        .filter(|s| {
            waiting.iter().any(|w| {
                by_rank.get(w).is_some_and(|r| {
                    r.trace.failure.as_deref() == Some("peer failed")
                        && r.calls.get(&seq).is_some_and(|e| e.peer == Some(*s))
                })
            })
        })
        .collect();
    let silent: Vec<Rank> = silent.into_iter().filter(|s| !died.contains(s)).collect();
    if !died.is_empty() {
        return format!(
            "{} failed in or before {name} and left no dump (killed or crashed?); {} failed \
             because of it{}",
            ranks(&died),
            ranks(&waiting),
            if silent.is_empty() {
                String::new()
            } else {
                format!("; {} left no dump", ranks(&silent))
            }
        );
    }
    let never: Vec<Rank> = absent.iter().chain(&silent).copied().collect();
    if !never.is_empty() || !late.is_empty() {
        let mut parts = Vec::new();
        if !never.is_empty() {
            let mut s = format!("{} never called {name}", ranks(&never));
            if !silent.is_empty() {
                s += &format!(" ({} left no dump)", ranks(&silent));
            }
            if let [one] = absent[..]
                && let Some(last) = by_rank.get(&one).and_then(|r| r.trace.entries.last())
            {
                s += &format!(
                    " (rank {one}'s last call: {}, {})",
                    last.name(),
                    state_word(last.state)
                );
            }
            parts.push(s);
        }
        if !late.is_empty() {
            parts.push(format!(
                "{} called {name} only after the others had given up",
                ranks(&late)
            ));
        }
        return format!("{}; {} wait for it", parts.join("; "), ranks(&waiting));
    }
    chain(&by_rank, seq, &name, &waiting)
}

fn state_word(s: CallState) -> &'static str {
    match s {
        CallState::Queued => "queued",
        CallState::Running => "running",
        CallState::Waiting => "waiting",
        CallState::Done => "done",
        CallState::Failed => "failed",
    }
}

/// `; rank 5 left no dump` for ranks of `0..size` without one.
fn no_dump(by_rank: &BTreeMap<Rank, Rank_<'_>>, size: usize) -> String {
    let missing: Vec<Rank> = (0..size).filter(|r| !by_rank.contains_key(r)).collect();
    if missing.is_empty() {
        String::new()
    } else {
        format!("; {} left no dump", ranks(&missing))
    }
}

/// Rule 1: the lowest sequence number at which ranks' calls differ.
fn mismatch(by_rank: &BTreeMap<Rank, Rank_<'_>>) -> Option<String> {
    let seqs: BTreeSet<u64> = by_rank
        .values()
        .flat_map(|r| r.calls.keys().copied())
        .collect();
    for seq in seqs {
        let calls: Vec<(Rank, &TraceEntry)> = by_rank
            .iter()
            .filter_map(|(&k, r)| r.calls.get(&seq).map(|e| (k, *e)))
            .collect();
        let mut groups: Vec<(Vec<Rank>, &TraceEntry)> = Vec::new();
        for (k, e) in &calls {
            match groups
                .iter_mut()
                .find(|(_, g)| signature(g) == signature(e))
            {
                Some((ks, _)) => ks.push(*k),
                None => groups.push((vec![*k], e)),
            }
        }
        if groups.len() < 2 {
            continue;
        }
        // The majority (ties: the group of the lowest rank) is taken as what was meant.
        let major = (0..groups.len())
            .max_by_key(|&i| (groups[i].0.len(), std::cmp::Reverse(groups[i].0[0])))
            .unwrap_or(0);
        let (major_ranks, m) = groups[major].clone();
        let others = if major_ranks.len() + 1 == calls.len() {
            "the others".to_string()
        } else {
            ranks(&major_ranks)
        };
        let lines: Vec<String> = groups
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != major)
            .map(|(_, (ks, e))| {
                if e.collective != m.collective {
                    format!(
                        "{} called {} where {others} called {}",
                        ranks(ks),
                        e.name(),
                        m.collective.as_deref().unwrap_or("?")
                    )
                } else {
                    format!(
                        "{} called {} with {} where {others} called it with {}",
                        ranks(ks),
                        e.name(),
                        differences(e, m),
                        differences(m, e)
                    )
                }
            })
            .collect();
        return Some(lines.join("; "));
    }
    None
}

/// Rule 3: everyone called collective `seq`; follow the ranks the waiters name.
fn chain(by_rank: &BTreeMap<Rank, Rank_<'_>>, seq: u64, name: &str, waiting: &[Rank]) -> String {
    let mut named: BTreeMap<Rank, usize> = BTreeMap::new();
    for w in waiting {
        if let Some(p) = by_rank
            .get(w)
            .and_then(|r| r.calls.get(&seq))
            .and_then(|e| e.peer)
            .filter(|p| p != w)
        {
            *named.entry(p).or_default() += 1;
        }
    }
    let Some((&first, _)) = named
        .iter()
        .max_by_key(|&(r, n)| (*n, std::cmp::Reverse(*r)))
    else {
        return format!(
            "{} did not finish {name}, and no dump names a rank they wait for",
            ranks(waiting)
        );
    };
    let mut at = first;
    let mut seen = BTreeSet::from([at]);
    loop {
        let Some(r) = by_rank.get(&at) else {
            return format!(
                "{} wait for rank {at} in {name}; rank {at} left no dump (dead or stopped?)",
                ranks(waiting)
            );
        };
        let Some(&e) = r.calls.get(&seq) else {
            return format!(
                "{} wait for rank {at} in {name}; rank {at}'s dump does not show that call",
                ranks(waiting)
            );
        };
        let next = e.peer.filter(|p| *p != at && !seen.contains(p));
        match (e.state, next) {
            (CallState::Waiting | CallState::Failed, Some(n)) if by_rank.contains_key(&n) => {
                seen.insert(n);
                at = n;
            }
            _ => break,
        }
    }
    let Some(&e) = by_rank.get(&at).and_then(|r| r.calls.get(&seq)) else {
        return format!("{} wait for rank {at} in {name}", ranks(waiting));
    };
    let others: Vec<Rank> = waiting.iter().copied().filter(|&w| w != at).collect();
    let step = e
        .step
        .map(|s| format!(" after {s} steps"))
        .unwrap_or_default();
    match e.state {
        CallState::Done => format!(
            "rank {at} finished {name}, but {} still wait for it (a lost message?)",
            ranks(&others)
        ),
        CallState::Failed => format!(
            "rank {at} failed {name} first: {}; {} failed after it",
            by_rank
                .get(&at)
                .and_then(|r| r.trace.error.as_deref())
                .unwrap_or("no error recorded"),
            ranks(&others)
        ),
        s => format!(
            "{} wait for rank {at} in {name}; rank {at} is {}{step}{}",
            ranks(&others),
            state_word(s),
            e.peer
                .filter(|&p| p != at)
                .map(|p| format!(" for rank {p}"))
                .unwrap_or_default()
        ),
    }
}

/// Unfinished point-to-point groups, when every collective finished.
fn point_to_point(by_rank: &BTreeMap<Rank, Rank_<'_>>) -> Option<String> {
    let lines: Vec<String> = by_rank
        .iter()
        .filter_map(|(&k, r)| {
            r.trace
                .entries
                .iter()
                .find(|e| e.kind == CallKind::PointToPoint && e.state != CallState::Done)
                .map(|e| {
                    format!(
                        "rank {k} did not finish {}{}",
                        e.name(),
                        e.peer
                            .map(|p| format!(" (waits for rank {p})"))
                            .unwrap_or_default()
                    )
                })
        })
        .collect();
    (!lines.is_empty()).then(|| lines.join("; "))
}

#[cfg(test)]
mod tests {
    use super::super::FORMAT;
    use super::*;

    fn entry(seq: u64, collective: &str, state: CallState, peer: Option<Rank>) -> TraceEntry {
        TraceEntry {
            id: seq,
            kind: CallKind::Collective,
            seq,
            collective: Some(collective.into()),
            dtype: Some("float32".into()),
            count: 12,
            op: Some("sum".into()),
            root: None,
            in_place: false,
            route: Some("ring".into()),
            peers: vec![],
            npeers: 0,
            state,
            peer,
            step: None,
            begin_ns: Some(seq * 1000),
            end_ns: (state == CallState::Done || state == CallState::Failed)
                .then_some(seq * 1000 + 10),
        }
    }

    fn trace(rank: Rank, size: usize, reason: &str, entries: Vec<TraceEntry>) -> Trace {
        Trace {
            format: FORMAT,
            comm: "c".into(),
            rank,
            size,
            host: "h".into(),
            pid: 1,
            reason: reason.into(),
            error: None,
            failure: (reason != "SIGUSR1").then(|| reason.to_string()),
            start_unix_ns: 1_000_000,
            dumped_ns: 1_000_000_000,
            recorded: entries.len() as u64,
            entries,
        }
    }

    fn done(n: u64) -> Vec<TraceEntry> {
        (0..n)
            .map(|s| entry(s, "all_reduce", CallState::Done, None))
            .collect()
    }

    #[test]
    fn odd_dumps_do_not_panic() {
        // A named rank whose dump lacks the call; a huge size; a rank beyond the size; an
        // empty dump; only point-to-point entries.
        let mut a = done(3);
        a.push(entry(3, "all_reduce", CallState::Waiting, Some(1)));
        let mut b = trace(1, 3, "SIGUSR1", vec![]);
        b.recorded = 10;
        let mut p2p = entry(0, "x", CallState::Waiting, Some(0));
        p2p.kind = CallKind::PointToPoint;
        p2p.collective = None;
        b.entries.push(p2p);
        let mut huge = trace(2, usize::MAX, "timeout", done(1));
        huge.comm = "c".into();
        let beyond = trace(7, 3, "timeout", done(2));
        let ts = vec![trace(0, 3, "timeout", a), b, huge, beyond];
        let lines = blame(&ts);
        assert_eq!(lines.len(), 1);
        assert!(!lines[0].1.is_empty());
        assert_eq!(ranks(&[]), "no rank");
        assert!(!blame(&[trace(0, 0, "x", vec![])])[0].1.is_empty());
    }

    #[test]
    fn rank_lists_read_as_ranges() {
        assert_eq!(ranks(&[3]), "rank 3");
        assert_eq!(ranks(&[2, 0, 1]), "ranks 0–2");
        assert_eq!(ranks(&[0, 2, 3, 4, 7, 8]), "ranks 0, 2–4, 7, 8");
    }

    #[test]
    fn a_rank_that_never_called() {
        let mut ts = Vec::new();
        for r in 0..3 {
            let mut e = done(5);
            e.push(entry(5, "all_reduce", CallState::Failed, Some((r + 3) % 4)));
            ts.push(trace(r, 4, "timeout", e));
        }
        ts.push(trace(3, 4, "SIGUSR1", done(5)));
        assert_eq!(
            blame(&ts)[0].1,
            "rank 3 never called all_reduce #5 (rank 3's last call: all_reduce #4, done); \
             ranks 0–2 wait for it"
        );
        // Without rank 3's dump.
        ts.pop();
        assert_eq!(
            blame(&ts)[0].1,
            "rank 3 never called all_reduce #5 (rank 3 left no dump); ranks 0–2 wait for it"
        );
    }

    #[test]
    fn a_rank_that_called_after_the_others_gave_up() {
        let mut ts = Vec::new();
        for r in 0..3 {
            let mut e = done(5);
            e.push(entry(5, "all_reduce", CallState::Failed, Some(3)));
            ts.push(trace(r, 4, "timeout", e));
        }
        let mut late = done(5);
        let mut e = entry(5, "all_reduce", CallState::Failed, Some(0));
        e.begin_ns = Some(9_000_000);
        late.push(e);
        ts.push(trace(3, 4, "peer failed", late));
        assert_eq!(
            blame(&ts)[0].1,
            "rank 3 called all_reduce #5 only after the others had given up; ranks 0–2 wait for it"
        );
    }

    #[test]
    fn different_collectives_at_one_sequence_number() {
        let mut ts: Vec<Trace> = (0..4).map(|r| trace(r, 4, "mismatch", done(17))).collect();
        for (r, t) in ts.iter_mut().enumerate() {
            let c = if r == 1 { "broadcast" } else { "all_reduce" };
            t.entries.push(entry(17, c, CallState::Failed, Some(1)));
        }
        assert_eq!(
            blame(&ts)[0].1,
            "rank 1 called broadcast #17 where the others called all_reduce"
        );
        ts[1].entries[17].collective = Some("all_reduce".into());
        ts[1].entries[17].count = 10;
        assert_eq!(
            blame(&ts)[0].1,
            "rank 1 called all_reduce #17 with count 10 where the others called it with count 12"
        );
    }

    #[test]
    fn a_rank_that_died() {
        let mut ts = Vec::new();
        for r in [0, 1, 3] {
            let mut e = done(2);
            e.push(entry(2, "all_reduce", CallState::Failed, Some(2)));
            ts.push(trace(r, 4, "peer failed", e));
        }
        assert_eq!(
            blame(&ts)[0].1,
            "rank 2 failed in or before all_reduce #2 and left no dump (killed or crashed?); \
             ranks 0, 1, 3 failed because of it"
        );
    }

    #[test]
    fn everyone_called_and_waits_along_a_chain() {
        let mut ts = Vec::new();
        for (r, peer) in [(0, 1), (1, 2), (2, 2)] {
            let mut e = done(3);
            let state = if r == 2 {
                CallState::Running
            } else {
                CallState::Waiting
            };
            e.push(entry(3, "reduce_scatter", state, Some(peer)));
            ts.push(trace(r, 3, "SIGUSR1", e));
        }
        ts[2].entries[3].peer = None;
        assert_eq!(
            blame(&ts)[0].1,
            "ranks 0, 1 wait for rank 2 in reduce_scatter #3; rank 2 is running"
        );
        let ts: Vec<Trace> = (0..2).map(|r| trace(r, 2, "requested", done(3))).collect();
        assert_eq!(
            blame(&ts)[0].1,
            "every call recorded by ranks 0, 1 finished"
        );
    }
}
