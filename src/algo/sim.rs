//! Runs every rank's [`Schedule`] in memory: the oracle for property tests and the way to reason
//! about a thousand ranks on a two-core machine.
//!
//! The simulator follows the schedule semantics of [`super::schedule`] exactly, with the least
//! help a transport gives: each directed link buffers at most [`SimConfig::link_buffer`] messages
//! (1 by default) that have been sent but not yet consumed. A send completes when its bytes have
//! left (it then no longer reads its source); a receive consumes the head of its link once its
//! dependencies are done. It reports:
//!
//! - deadlock (steps left, nothing can move), with what each stuck step waits for;
//! - unmatched or mis-sized messages, regions outside their buffer, bad peers or dependencies;
//! - data races: two steps of one rank touching the same bytes, at least one writing, with no
//!   dependency path between them ([`SimConfig::check_races`]);
//! - per-rank bytes and messages sent and received, the critical path in message hops, and the
//!   completion time under an α-β [`LinkModel`] in which each rank sends one message at a time
//!   and receives one at a time.
//!
//! Like the rest of [`super`], it does no I/O and reads no clock; the arithmetic is supplied by
//! the caller through [`Arithmetic`] so the module needs nothing but [`crate::types`].

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::fmt;

use super::{Buffer, Hosts, Op, Region, Schedule, StepId};
use crate::types::{DataType, Rank, ReduceOp};

/// Element-wise arithmetic the simulator applies for `RecvReduce`, `Reduce` and `Divide`.
pub trait Arithmetic {
    /// `dst = dst ⊕ src` on elements of `dtype` (`op` is never `Avg`).
    fn reduce(&self, dst: &mut [u8], src: &[u8], dtype: DataType, op: ReduceOp);
    /// `dst = dst / by` on elements of `dtype`.
    fn divide(&self, dst: &mut [u8], dtype: DataType, by: usize);
}

/// The α-β cost model: a message of b bytes takes `alpha + b·beta` seconds to arrive. A rank
/// sends one message at a time (its port is busy `b·beta` per message) and receives one at a time
/// (later arrivals queue); reducing b bytes costs `b·gamma` and copying them `b·copy` on the rank
/// that does it. Sending and receiving a message each also hold the rank's processor `overhead`
/// seconds (LogP's o), one message after another: what a rank pays per message when it has no
/// core of its own.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkModel {
    /// Per-message latency, seconds.
    pub alpha: f64,
    /// Seconds per byte on a link (1 / bandwidth).
    pub beta: f64,
    /// Seconds per byte reduced.
    pub gamma: f64,
    /// Seconds per byte copied.
    pub copy: f64,
    /// Seconds of the rank's processor per message sent and per message received.
    pub overhead: f64,
    /// Whether messages under this model between ranks of one host take turns on the host's
    /// memory bus (copies through shared memory), or use each rank's own ports (a network
    /// stack, whose copies run on the sending and the receiving rank's cores).
    pub bus: bool,
}

impl LinkModel {
    /// A model with latency `alpha` seconds and `bandwidth` bytes per second, free computation.
    pub fn new(alpha: f64, bandwidth: f64) -> LinkModel {
        LinkModel {
            alpha,
            beta: 1.0 / bandwidth,
            gamma: 0.0,
            copy: 0.0,
            overhead: 0.0,
            bus: true,
        }
    }
}

/// How to simulate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SimConfig {
    /// Messages a directed link holds between send and consumption (≥ 1).
    pub link_buffer: usize,
    /// Whether to check for data races (quadratic in steps per rank; off for huge runs).
    pub check_races: bool,
    /// The cost model used for [`SimReport::time`].
    pub model: LinkModel,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            link_buffer: 1,
            check_races: true,
            model: LinkModel::new(5e-6, 10e9),
        }
    }
}

/// One rank's user buffers (the scratch buffer is the simulator's).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RankBuffers {
    /// The input (send) buffer.
    pub input: Vec<u8>,
    /// The output (receive) buffer.
    pub output: Vec<u8>,
}

/// Traffic of one rank.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RankStats {
    /// Bytes sent.
    pub bytes_sent: usize,
    /// Bytes received.
    pub bytes_received: usize,
    /// Messages sent.
    pub messages_sent: usize,
    /// Messages received.
    pub messages_received: usize,
    /// Steps executed.
    pub steps: usize,
}

/// What a successful simulation measured.
#[derive(Clone, Debug, PartialEq)]
pub struct SimReport {
    /// Per-rank traffic, indexed by rank.
    pub ranks: Vec<RankStats>,
    /// Longest chain of dependent messages (message hops on the critical path).
    pub rounds: usize,
    /// Completion time of the last step under [`SimConfig::model`], seconds.
    pub time: f64,
}

/// Why a set of schedules is wrong.
#[derive(Clone, Debug, PartialEq)]
pub enum SimError {
    /// The number of schedules and of buffers differ.
    Shape(String),
    /// A step names a peer outside the communicator, or itself.
    BadPeer {
        /// Rank of the step.
        rank: Rank,
        /// The step.
        step: StepId,
        /// The peer it names.
        peer: Rank,
    },
    /// A step depends on itself or a later step.
    BadDependency {
        /// Rank of the step.
        rank: Rank,
        /// The step.
        step: StepId,
        /// The offending dependency.
        dep: StepId,
    },
    /// A region lies outside its buffer.
    OutOfBounds {
        /// Rank of the step.
        rank: Rank,
        /// The step.
        step: StepId,
        /// The region.
        region: Region,
        /// Length of that buffer on that rank.
        buffer_len: usize,
    },
    /// A link's sends and receives differ in number.
    Unmatched {
        /// Sending rank.
        from: Rank,
        /// Receiving rank.
        to: Rank,
        /// Sends posted on the link.
        sends: usize,
        /// Receives posted on the link.
        recvs: usize,
    },
    /// The k-th message of a link has different sizes at its two ends.
    SizeMismatch {
        /// Sending rank.
        from: Rank,
        /// Receiving rank.
        to: Rank,
        /// Index of the message on the link.
        index: usize,
        /// Bytes sent.
        sent: usize,
        /// Bytes the receive expects.
        expected: usize,
    },
    /// Two steps of one rank touch the same bytes, one writing, unordered by dependencies.
    Race {
        /// The rank.
        rank: Rank,
        /// The earlier step.
        first: StepId,
        /// The later step.
        second: StepId,
    },
    /// Steps remain and none can make progress.
    Deadlock {
        /// Steps not done, over all ranks.
        pending: usize,
        /// A few of them: (rank, step, what it waits for).
        stuck: Vec<(Rank, StepId, String)>,
    },
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::Shape(why) => write!(f, "bad simulation input: {why}"),
            SimError::BadPeer { rank, step, peer } => {
                write!(f, "rank {rank} step {step}: bad peer {peer}")
            }
            SimError::BadDependency { rank, step, dep } => {
                write!(
                    f,
                    "rank {rank} step {step}: depends on step {dep}, which is not earlier"
                )
            }
            SimError::OutOfBounds {
                rank,
                step,
                region,
                buffer_len,
            } => write!(
                f,
                "rank {rank} step {step}: region {region:?} outside its buffer of {buffer_len} bytes"
            ),
            SimError::Unmatched {
                from,
                to,
                sends,
                recvs,
            } => write!(f, "link {from}->{to}: {sends} sends but {recvs} receives"),
            SimError::SizeMismatch {
                from,
                to,
                index,
                sent,
                expected,
            } => write!(
                f,
                "link {from}->{to} message {index}: {sent} bytes sent, {expected} expected"
            ),
            SimError::Race {
                rank,
                first,
                second,
            } => write!(
                f,
                "rank {rank}: steps {first} and {second} touch the same bytes without ordering"
            ),
            SimError::Deadlock { pending, stuck } => {
                write!(f, "deadlock with {pending} steps pending:")?;
                for (r, s, why) in stuck {
                    write!(f, " [rank {r} step {s}: {why}]")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for SimError {}

/// Runs `schedules[r]` as rank r over `buffers[r]` (which it updates in place) and reports what
/// happened.
pub fn simulate(
    schedules: &[Schedule],
    dtype: DataType,
    buffers: &mut [RankBuffers],
    arith: &dyn Arithmetic,
    config: &SimConfig,
) -> Result<SimReport, SimError> {
    if schedules.len() != buffers.len() {
        return Err(SimError::Shape(format!(
            "{} schedules but {} buffers",
            schedules.len(),
            buffers.len()
        )));
    }
    run(schedules, dtype, Some((buffers, arith)), config, None)
}

/// Runs the schedules without data — traffic, rounds and time only — so that sizes far beyond
/// memory can be priced. Regions of the user buffers are not bounds-checked.
pub fn price(
    schedules: &[Schedule],
    dtype: DataType,
    config: &SimConfig,
) -> Result<SimReport, SimError> {
    run(schedules, dtype, None, config, None)
}

/// [`price`] for ranks spread over `hosts`: a message between ranks of one host travels under
/// [`SimConfig::model`], one between hosts under `remote`. The ranks of a host share its memory
/// and its network card: their messages to each other take turns on one bus per host (a
/// transfer of b bytes holds it `b·beta`), and their messages to other hosts leave through one
/// port per host and arrive through one (each held `b·beta` of the remote model), the bus and
/// the card working side by side.
pub fn price_across(
    schedules: &[Schedule],
    dtype: DataType,
    config: &SimConfig,
    hosts: &Hosts,
    remote: LinkModel,
) -> Result<SimReport, SimError> {
    if hosts.nranks() != schedules.len() {
        return Err(SimError::Shape(format!(
            "{} schedules but {} ranks placed on hosts",
            schedules.len(),
            hosts.nranks()
        )));
    }
    run(schedules, dtype, None, config, Some((hosts, remote)))
}

fn run(
    schedules: &[Schedule],
    dtype: DataType,
    data: Option<(&mut [RankBuffers], &dyn Arithmetic)>,
    config: &SimConfig,
    remote: Option<(&Hosts, LinkModel)>,
) -> Result<SimReport, SimError> {
    if config.link_buffer == 0 {
        return Err(SimError::Shape(
            "links must buffer at least one message".into(),
        ));
    }
    // Validates peers, dependencies, bounds and matching first: the race check relies on them.
    let sim = Sim::new(schedules, dtype, data, config, remote)?;
    if config.check_races {
        for (r, s) in schedules.iter().enumerate() {
            check_races(r, s)?;
        }
    }
    sim.run()
}

/// A time-ordered event.
struct Event {
    t: f64,
    seq: u64,
    kind: EventKind,
}

#[derive(Clone, Copy)]
enum EventKind {
    Ready(u32, StepId),
    Done(u32, StepId),
    Delivered(u32),
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Event {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: BinaryHeap is a max-heap and we want the earliest event first.
        other.t.total_cmp(&self.t).then(other.seq.cmp(&self.seq))
    }
}

struct Message {
    data: Vec<u8>,
    delivered_at: f64,
    depth: u32,
}

struct Link {
    from: u32,
    to: u32,
    /// Port kind: 0 between ranks of one host, 1 between hosts.
    kind: usize,
    /// Indices into [`Sim::out_free`] and [`Sim::in_free`] of the ports the link's messages
    /// leave and arrive through.
    ports: (u32, u32),
    /// Whether both ends are one resource (a host's memory bus), held once per message.
    shared: bool,
    sends: Vec<StepId>,
    recvs: Vec<StepId>,
    next_send: usize,
    next_recv: usize,
    queue: VecDeque<Message>,
}

#[derive(Clone, Copy, Default)]
struct StepState {
    /// Dependencies not yet done.
    remaining: u32,
    /// Message hops on the longest chain ending here.
    depth: u32,
    /// Link index of a message step (unused for local steps).
    link: u32,
    ready: bool,
    done: bool,
}

struct RankState {
    /// Per-step state, packed so one event touches one cache line.
    st: Vec<StepState>,
    /// Dependents in CSR form: `dependents[offsets[i]..offsets[i+1]]`.
    offsets: Vec<u32>,
    dependents: Vec<StepId>,
    scratch: Vec<u8>,
    cpu_free: f64,
    stats: RankStats,
}

struct Sim<'a> {
    schedules: &'a [Schedule],
    dtype: DataType,
    /// The ranks' buffers and the arithmetic, or `None` when pricing without data.
    data: Option<(&'a mut [RankBuffers], &'a dyn Arithmetic)>,
    config: &'a SimConfig,
    /// The model of links between hosts (kind 1), when ranks are spread over hosts.
    remote: LinkModel,
    /// When each port is next free: per rank without hosts; with hosts, per rank (unused),
    /// then each host's bus, then each host's network card.
    out_free: Vec<f64>,
    in_free: Vec<f64>,
    ranks: Vec<RankState>,
    links: Vec<Link>,
    /// Future events, earliest first.
    events: BinaryHeap<Event>,
    /// Events due now, in the order they were raised: most events are immediate (a step
    /// becoming ready, free local work), and a FIFO is far cheaper than the heap for them.
    due: VecDeque<EventKind>,
    seq: u64,
    now: f64,
    pending: usize,
}

impl<'a> Sim<'a> {
    fn new(
        schedules: &'a [Schedule],
        dtype: DataType,
        data: Option<(&'a mut [RankBuffers], &'a dyn Arithmetic)>,
        config: &'a SimConfig,
        remote: Option<(&Hosts, LinkModel)>,
    ) -> Result<Sim<'a>, SimError> {
        let n = schedules.len();
        let mut link_ids: HashMap<(u32, u32), u32> = HashMap::new();
        let mut links: Vec<Link> = Vec::new();
        let mut ranks = Vec::with_capacity(n);
        let mut pending = 0;
        for (r, s) in schedules.iter().enumerate() {
            let len = s.len();
            pending += len;
            let mut remaining = vec![0u32; len];
            let mut counts = vec![0u32; len + 1];
            let mut link = vec![u32::MAX; len];
            for (i, step) in s.steps().iter().enumerate() {
                let id = i as StepId;
                for &d in s.deps(id) {
                    if d >= id {
                        return Err(SimError::BadDependency {
                            rank: r,
                            step: id,
                            dep: d,
                        });
                    }
                    counts[d as usize + 1] += 1;
                }
                remaining[i] = s.deps(id).len() as u32;
                let user = data
                    .as_ref()
                    .map(|(b, _)| (b[r].input.len(), b[r].output.len()));
                check_bounds(r, id, &step.op, user, s.scratch_len())?;
                if let Some(peer) = step.op.peer() {
                    if peer >= n || peer == r {
                        return Err(SimError::BadPeer {
                            rank: r,
                            step: id,
                            peer,
                        });
                    }
                    let key = if step.op.is_receive() {
                        (peer as u32, r as u32)
                    } else {
                        (r as u32, peer as u32)
                    };
                    let li = *link_ids.entry(key).or_insert_with(|| {
                        let (kind, ports, shared) = match remote {
                            None => (0, key, false),
                            Some((h, _)) => {
                                let (a, b) = (h.host(key.0 as usize), h.host(key.1 as usize));
                                let (bus, card) = (n + a, n + h.count());
                                if a == b && config.model.bus {
                                    (0, (bus as u32, bus as u32), true)
                                } else if a == b {
                                    (0, key, false)
                                } else {
                                    (1, ((card + a) as u32, (card + b) as u32), false)
                                }
                            }
                        };
                        links.push(Link {
                            from: key.0,
                            to: key.1,
                            kind,
                            ports,
                            shared,
                            sends: Vec::new(),
                            recvs: Vec::new(),
                            next_send: 0,
                            next_recv: 0,
                            queue: VecDeque::new(),
                        });
                        (links.len() - 1) as u32
                    });
                    link[i] = li;
                    if step.op.is_receive() {
                        links[li as usize].recvs.push(id);
                    } else {
                        links[li as usize].sends.push(id);
                    }
                }
            }
            for i in 0..len {
                counts[i + 1] += counts[i];
            }
            let mut fill = counts.clone();
            let mut dependents = vec![0; counts[len] as usize];
            for i in 0..len {
                for &d in s.deps(i as StepId) {
                    dependents[fill[d as usize] as usize] = i as StepId;
                    fill[d as usize] += 1;
                }
            }
            ranks.push(RankState {
                st: remaining
                    .iter()
                    .zip(&link)
                    .map(|(&remaining, &link)| StepState {
                        remaining,
                        link,
                        ..StepState::default()
                    })
                    .collect(),
                offsets: counts,
                dependents,
                scratch: if data.is_some() {
                    vec![0; s.scratch_len()]
                } else {
                    Vec::new()
                },
                cpu_free: 0.0,
                stats: RankStats::default(),
            });
        }
        // Static matching: equal counts and sizes on every link.
        for l in &links {
            if l.sends.len() != l.recvs.len() {
                return Err(SimError::Unmatched {
                    from: l.from as usize,
                    to: l.to as usize,
                    sends: l.sends.len(),
                    recvs: l.recvs.len(),
                });
            }
            for (index, (&s, &r)) in l.sends.iter().zip(&l.recvs).enumerate() {
                let sent = schedules[l.from as usize].steps()[s as usize]
                    .op
                    .message_len();
                let expected = schedules[l.to as usize].steps()[r as usize]
                    .op
                    .message_len();
                if sent != expected {
                    return Err(SimError::SizeMismatch {
                        from: l.from as usize,
                        to: l.to as usize,
                        index,
                        sent,
                        expected,
                    });
                }
            }
        }
        let mut sim = Sim {
            schedules,
            dtype,
            data,
            config,
            remote: remote.map_or(config.model, |(_, m)| m),
            out_free: vec![0.0; n + 2 * remote.map_or(0, |(h, _)| h.count())],
            in_free: vec![0.0; n + 2 * remote.map_or(0, |(h, _)| h.count())],
            ranks,
            links,
            events: BinaryHeap::new(),
            due: VecDeque::new(),
            seq: 0,
            now: 0.0,
            pending,
        };
        for (r, schedule) in schedules.iter().enumerate() {
            for i in 0..schedule.len() {
                if sim.ranks[r].st[i].remaining == 0 {
                    sim.push(0.0, EventKind::Ready(r as u32, i as StepId));
                }
            }
        }
        Ok(sim)
    }

    fn push(&mut self, t: f64, kind: EventKind) {
        if t <= self.now {
            self.due.push_back(kind);
        } else {
            self.seq += 1;
            self.events.push(Event {
                t,
                seq: self.seq,
                kind,
            });
        }
    }

    fn next_event(&mut self) -> Option<EventKind> {
        if let Some(kind) = self.due.pop_front() {
            return Some(kind);
        }
        let ev = self.events.pop()?;
        self.now = ev.t;
        Some(ev.kind)
    }

    fn run(mut self) -> Result<SimReport, SimError> {
        while let Some(kind) = self.next_event() {
            match kind {
                EventKind::Ready(r, s) => self.on_ready(r as usize, s),
                EventKind::Done(r, s) => self.on_done(r as usize, s),
                EventKind::Delivered(l) => self.try_recv(l as usize),
            }
        }
        if self.pending > 0 {
            return Err(self.deadlock());
        }
        let rounds = self
            .ranks
            .iter()
            .flat_map(|r| r.st.iter().map(|s| s.depth))
            .max()
            .unwrap_or(0);
        Ok(SimReport {
            ranks: self.ranks.iter().map(|r| r.stats).collect(),
            rounds: rounds as usize,
            time: self.now,
        })
    }

    fn on_ready(&mut self, r: usize, s: StepId) {
        let op = self.schedules[r].steps()[s as usize].op;
        let depth = self.schedules[r]
            .deps(s)
            .iter()
            .map(|&d| self.ranks[r].st[d as usize].depth)
            .max();
        let st = &mut self.ranks[r].st[s as usize];
        st.depth = depth.unwrap_or(0);
        st.ready = true;
        let link = st.link as usize;
        match op {
            Op::Send { .. } => self.try_send(link),
            Op::Recv { .. } | Op::RecvReduce { .. } => self.try_recv(link),
            Op::Copy { dst, src } => {
                self.apply(r, dst, src, None);
                self.finish_local(r, s, dst.len as f64 * self.config.model.copy);
            }
            Op::Reduce { dst, a, b, op } => {
                let b = self.read(r, b);
                self.apply(r, dst, a, Some((op, &b)));
                self.finish_local(r, s, dst.len as f64 * self.config.model.gamma);
            }
            Op::Divide { dst, by } => {
                let dtype = self.dtype;
                if let Some((bufs, arith)) = &mut self.data {
                    arith.divide(
                        region_mut(bufs, &mut self.ranks[r].scratch, r, dst),
                        dtype,
                        by,
                    );
                }
                self.finish_local(r, s, dst.len as f64 * self.config.model.gamma);
            }
        }
    }

    /// The model of links of port kind `kind` (0 inside a host, 1 between hosts).
    fn model(&self, kind: usize) -> LinkModel {
        if kind == 0 {
            self.config.model
        } else {
            self.remote
        }
    }

    /// Completes local work of `cost` seconds on rank r's processor.
    fn finish_local(&mut self, r: usize, s: StepId, cost: f64) {
        let start = self.now.max(self.ranks[r].cpu_free);
        self.ranks[r].cpu_free = start + cost;
        self.push(start + cost, EventKind::Done(r as u32, s));
    }

    fn on_done(&mut self, r: usize, s: StepId) {
        let rank = &mut self.ranks[r];
        rank.st[s as usize].done = true;
        rank.stats.steps += 1;
        self.pending -= 1;
        let (lo, hi) = (
            rank.offsets[s as usize] as usize,
            rank.offsets[s as usize + 1] as usize,
        );
        for i in lo..hi {
            let d = self.ranks[r].dependents[i];
            let st = &mut self.ranks[r].st[d as usize];
            st.remaining -= 1;
            if st.remaining == 0 {
                self.push(self.now, EventKind::Ready(r as u32, d));
            }
        }
    }

    /// Starts every send of link `l` that is next in order, ready, and has buffer room.
    fn try_send(&mut self, l: usize) {
        loop {
            let link = &self.links[l];
            let (from, k) = (link.from as usize, link.kind);
            let ((po, pi), shared) = (link.ports, link.shared);
            let (po, pi) = (po as usize, pi as usize);
            let Some(&s) = link.sends.get(link.next_send) else {
                return;
            };
            if !self.ranks[from].st[s as usize].ready || link.queue.len() >= self.config.link_buffer
            {
                return;
            }
            let Op::Send { src, .. } = self.schedules[from].steps()[s as usize].op else {
                unreachable!("send list holds sends")
            };
            let data = self.read(from, src);
            // The sender's port is busy for its own transmission only; the receiver's port
            // takes arrivals one at a time, queueing the rest (a buffering switch).
            let m = self.model(k);
            let wire = src.len as f64 * m.beta;
            // The sender's processor hands the message over first.
            let handed = self.now.max(self.ranks[from].cpu_free) + m.overhead;
            self.ranks[from].cpu_free = handed;
            let (start, arrive) = if shared {
                let start = handed.max(self.out_free[po]);
                self.out_free[po] = start + wire;
                (start, start)
            } else {
                let start = handed.max(self.out_free[po]);
                self.out_free[po] = start + wire;
                let arrive = start.max(self.in_free[pi]);
                self.in_free[pi] = arrive + wire;
                (start, arrive)
            };
            let delivered_at = arrive + wire + m.alpha;
            let depth = self.ranks[from].st[s as usize].depth;
            let stats = &mut self.ranks[from].stats;
            stats.bytes_sent += src.len;
            stats.messages_sent += 1;
            let link = &mut self.links[l];
            link.queue.push_back(Message {
                data,
                delivered_at,
                depth,
            });
            link.next_send += 1;
            self.push(start + wire, EventKind::Done(from as u32, s));
            self.push(delivered_at, EventKind::Delivered(l as u32));
        }
    }

    /// Consumes delivered messages of link `l` for receives that are next in order and ready.
    fn try_recv(&mut self, l: usize) {
        loop {
            let link = &self.links[l];
            let to = link.to as usize;
            let Some(&s) = link.recvs.get(link.next_recv) else {
                return;
            };
            let Some(head) = link.queue.front() else {
                return;
            };
            if !self.ranks[to].st[s as usize].ready || head.delivered_at > self.now {
                return;
            }
            let msg = self.links[l].queue.pop_front().expect("checked non-empty");
            self.links[l].next_recv += 1;
            let depth = &mut self.ranks[to].st[s as usize].depth;
            *depth = (*depth).max(msg.depth + 1);
            let op = self.schedules[to].steps()[s as usize].op;
            let stats = &mut self.ranks[to].stats;
            stats.bytes_received += op.message_len();
            stats.messages_received += 1;
            let cost = match op {
                Op::Recv { dst, .. } => {
                    if let Some((bufs, _)) = &mut self.data {
                        region_mut(bufs, &mut self.ranks[to].scratch, to, dst)
                            .copy_from_slice(&msg.data);
                    }
                    dst.len as f64 * self.config.model.copy
                }
                Op::RecvReduce { dst, src, op, .. } => {
                    self.apply(to, dst, src, Some((op, &msg.data)));
                    dst.len as f64 * self.config.model.gamma
                }
                _ => unreachable!("receive list holds receives"),
            };
            let overhead = self.model(self.links[l].kind).overhead;
            self.finish_local(to, s, overhead + cost);
            // A slot freed: the sender may continue.
            self.try_send(l);
        }
    }

    /// The bytes of `region` on rank r (empty when pricing without data).
    fn read(&mut self, r: usize, region: Region) -> Vec<u8> {
        match &mut self.data {
            Some((bufs, _)) => region_mut(bufs, &mut self.ranks[r].scratch, r, region).to_vec(),
            None => Vec::new(),
        }
    }

    /// `dst = src`, then `dst = dst ⊕ operand` if one is given (no-op without data).
    fn apply(&mut self, r: usize, dst: Region, src: Region, operand: Option<(ReduceOp, &[u8])>) {
        let value = self.read(r, src);
        let dtype = self.dtype;
        if let Some((bufs, arith)) = &mut self.data {
            let out = region_mut(bufs, &mut self.ranks[r].scratch, r, dst);
            out.copy_from_slice(&value);
            if let Some((op, operand)) = operand {
                arith.reduce(out, operand, dtype, op);
            }
        }
    }

    fn deadlock(&self) -> SimError {
        let mut stuck = Vec::new();
        for (r, rank) in self.ranks.iter().enumerate() {
            for (i, step) in self.schedules[r].steps().iter().enumerate() {
                if rank.st[i].done || stuck.len() >= 8 {
                    continue;
                }
                let why = if !rank.st[i].ready {
                    let waiting: Vec<_> = self.schedules[r]
                        .deps(i as StepId)
                        .iter()
                        .filter(|&&d| !rank.st[d as usize].done)
                        .collect();
                    if waiting.iter().any(|&&d| rank.st[d as usize].ready) {
                        continue; // report the root causes, not everything behind them
                    }
                    format!("{:?} waits for steps {waiting:?}", step.op)
                } else {
                    let link = &self.links[rank.st[i].link as usize];
                    format!(
                        "{:?} is ready; link {}->{} is at send {} / receive {} with {} queued",
                        step.op,
                        link.from,
                        link.to,
                        link.next_send,
                        link.next_recv,
                        link.queue.len()
                    )
                };
                stuck.push((r, i as StepId, why));
            }
        }
        SimError::Deadlock {
            pending: self.pending,
            stuck,
        }
    }
}

/// The bytes of `region` on rank r.
fn region_mut<'b>(
    bufs: &'b mut [RankBuffers],
    scratch: &'b mut [u8],
    r: usize,
    region: Region,
) -> &'b mut [u8] {
    let range = region.offset..region.end();
    match region.buffer {
        Buffer::Input => &mut bufs[r].input[range],
        Buffer::Output => &mut bufs[r].output[range],
        Buffer::Scratch => &mut scratch[range],
    }
}

/// Checks that every region of `op` lies in its buffer; `user` gives the input and output
/// lengths, or `None` to check scratch only.
fn check_bounds(
    rank: Rank,
    step: StepId,
    op: &Op,
    user: Option<(usize, usize)>,
    scratch_len: usize,
) -> Result<(), SimError> {
    let (reads, write) = op.accesses();
    for region in reads.into_iter().flatten().chain(write) {
        let len = match (region.buffer, user) {
            (Buffer::Input, Some((input, _))) => input,
            (Buffer::Output, Some((_, output))) => output,
            (Buffer::Input | Buffer::Output, None) => continue,
            (Buffer::Scratch, _) => scratch_len,
        };
        if region.end() > len {
            return Err(SimError::OutOfBounds {
                rank,
                step,
                region,
                buffer_len: len,
            });
        }
    }
    Ok(())
}

/// Fails if two steps touch overlapping bytes, one of them writing, and neither depends
/// (transitively) on the other.
fn check_races(rank: Rank, schedule: &Schedule) -> Result<(), SimError> {
    let n = schedule.len();
    let words = n.div_ceil(64);
    // ancestors[i] has bit d set when step i (transitively) depends on step d.
    let mut ancestors = vec![0u64; n * words];
    for i in 0..n {
        for &d in schedule.deps(i as StepId) {
            let d = d as usize;
            let (lo, hi) = ancestors.split_at_mut(i * words);
            let row = &mut hi[..words];
            for (w, &a) in row.iter_mut().zip(&lo[d * words..(d + 1) * words]) {
                *w |= a;
            }
            row[d / 64] |= 1 << (d % 64);
        }
    }
    let before = |a: usize, b: usize| ancestors[b * words + a / 64] & (1 << (a % 64)) != 0;
    // All accesses, per buffer, sorted by start.
    let mut accesses: Vec<(Buffer, usize, usize, usize, bool)> = Vec::new();
    for (i, step) in schedule.steps().iter().enumerate() {
        let (reads, write) = step.op.accesses();
        for r in reads.into_iter().flatten().filter(|r| r.len > 0) {
            accesses.push((r.buffer, r.offset, r.end(), i, false));
        }
        if let Some(w) = write.filter(|w| w.len > 0) {
            accesses.push((w.buffer, w.offset, w.end(), i, true));
        }
    }
    accesses.sort_unstable_by_key(|a| (a.0, a.1));
    for (k, &(buf, _, end, i, wi)) in accesses.iter().enumerate() {
        for &(buf2, start2, _, j, wj) in &accesses[k + 1..] {
            if buf2 != buf || start2 >= end {
                break;
            }
            if i == j || !(wi || wj) {
                continue;
            }
            let (a, b) = (i.min(j), i.max(j));
            if !before(a, b) {
                return Err(SimError::Race {
                    rank,
                    first: a as StepId,
                    second: b as StepId,
                });
            }
        }
    }
    Ok(())
}
