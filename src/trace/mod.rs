//! The flight recorder: every rank keeps its communicator's last N calls — sequence number,
//! collective, type, count, root, route, peers, state and times — and writes them as JSON when
//! a call fails with [`Error::Timeout`], [`Error::PeerFailed`] or [`Error::Mismatch`], when
//! the process gets SIGUSR1, and when asked ([`crate::Communicator::dump_trace`]). [`blame`]
//! reads every rank's dump of one communicator and says in one line who the job waits for:
//! `rank 3 never called all_reduce #1042; ranks 0–2 wait for it`.
//!
//! # Cost
//!
//! Recording is on every call's path, so it takes no lock and allocates nothing: a ring of
//! fixed slots of atomic words, each guarded by a sequence lock (the writer makes the slot's
//! version odd, writes, makes it even; a reader copies and retries if the version moved). Only
//! the thread holding the communicator's state lock writes, so writers never race one another;
//! a reader (a dump from the signal thread) never blocks them. A call costs two clock reads and
//! a dozen relaxed stores (`benches/trace.rs`); a call of the area's one-turn lane, none
//! unless it waits or fails: its begin is read when it first waits (so a call that hangs has
//! one) or fails, and its end only if it fails.
//!
//! # Where dumps go
//!
//! `OXCCL_TRACE_DIR` ([`Config::trace_dir`]), else `$TMPDIR/oxccl-trace-<uid>`; one file per
//! rank and communicator, `<comm>.rank<r>.json`, where `<comm>` is a tag every rank of the
//! communicator computes alike (a hash of its store namespace and job secret).

mod blame;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Instant, SystemTime};

use serde::{Deserialize, Serialize};

pub use blame::blame;

use crate::algo::{Algorithm, Collective, Plan};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::tune::{DeviceWay, Route, Way};
use crate::types::{DataType, Rank, ReduceOp};

/// Calls a recorder keeps by default (`OXCCL_TRACE_ENTRIES`).
pub const DEFAULT_ENTRIES: usize = 2000;
/// Most calls a recorder may keep (72 MiB of slots).
pub const MAX_ENTRIES: usize = 1 << 20;
/// The version of the dump format ([`Trace::format`]). 2: an entry's `begin_ns` may be null
/// (a call of the area's one-turn lane that neither waited nor failed); readers of 2 read 1.
pub const FORMAT: u32 = 2;

/// One rank's dump of one communicator's recent calls.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trace {
    /// [`FORMAT`].
    pub format: u32,
    /// The communicator's tag, the same on all its ranks (and different for its splits).
    pub comm: String,
    /// This rank.
    pub rank: Rank,
    /// Ranks in the communicator.
    pub size: usize,
    /// The host's name.
    pub host: String,
    /// This process's id.
    pub pid: u32,
    /// Why it was written: `timeout`, `peer failed`, `mismatch`, `SIGUSR1`, `requested`.
    pub reason: String,
    /// The error that failed the communicator, if one did.
    pub error: Option<String>,
    /// Its kind: `timeout`, `peer failed`, `mismatch`.
    pub failure: Option<String>,
    /// When the recorder started, in nanoseconds since the Unix epoch (entries' times are
    /// relative to it).
    pub start_unix_ns: u64,
    /// When this dump was taken, in nanoseconds since the recorder started.
    pub dumped_ns: u64,
    /// Calls recorded since the start (older ones than `entries` holds were overwritten).
    pub recorded: u64,
    /// The kept calls, oldest first.
    pub entries: Vec<TraceEntry>,
}

/// One recorded call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceEntry {
    /// Its position among this recorder's calls.
    pub id: u64,
    /// `collective` or `point_to_point`.
    pub kind: CallKind,
    /// The collective's sequence number in the communicator (`all_reduce #12`), or for a
    /// point-to-point group, its number among the groups with its first peer.
    pub seq: u64,
    /// The collective (snake case), for collectives.
    pub collective: Option<String>,
    /// The element type, for collectives.
    pub dtype: Option<String>,
    /// Element count, for collectives.
    pub count: u64,
    /// The reduction operator, for collectives that reduce.
    pub op: Option<String>,
    /// The root, for rooted collectives.
    pub root: Option<Rank>,
    /// Whether the collective ran in place.
    pub in_place: bool,
    /// The route the routing decision took (`shm one-shot`, `ring`, `hierarchical/direct`).
    pub route: Option<String>,
    /// For point-to-point groups, the first peer (`npeers` in all).
    pub peers: Vec<Rank>,
    /// How many peers a point-to-point group has.
    pub npeers: usize,
    /// Where the call stands.
    pub state: CallState,
    /// The rank it waits for (`waiting`), or whose failure or call failed it (`failed`).
    pub peer: Option<Rank>,
    /// Steps of its schedule done when it was last seen waiting (or area turns for calls
    /// through the shared area).
    pub step: Option<u64>,
    /// When it was called, in nanoseconds since the recorder started. For a call of the
    /// area's one-turn lane, when it first had to wait (within a microsecond of its call, the
    /// few hundred instructions before its first look at a peer), or when it failed; `None`
    /// for one that did neither (its time is not read: a clock read is a tenth of such a call).
    pub begin_ns: Option<u64>,
    /// When it ended, in nanoseconds since the recorder started; `None` while it runs, and
    /// for a call of the area's one-turn lane that succeeded (its end is not timed).
    pub end_ns: Option<u64>,
}

/// What kind of call an entry records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallKind {
    /// A collective.
    Collective,
    /// A group of sends and receives.
    PointToPoint,
}

/// Where a recorded call stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallState {
    /// Queued behind earlier calls.
    Queued,
    /// Running, not (yet) seen waiting.
    Running,
    /// Running, and seen idle waiting for [`TraceEntry::peer`].
    Waiting,
    /// Finished.
    Done,
    /// Failed.
    Failed,
}

impl TraceEntry {
    /// `all_reduce #12`, or `point-to-point with rank 3 #0`.
    pub fn name(&self) -> String {
        match (&self.kind, &self.collective) {
            (CallKind::Collective, Some(c)) => format!("{c} #{}", self.seq),
            _ => match self.peers.first() {
                Some(p) if self.npeers > 1 => {
                    format!("point-to-point with rank {p} and {} more", self.npeers - 1)
                }
                Some(p) => format!("point-to-point with rank {p}"),
                None => "point-to-point".into(),
            },
        }
    }

    /// Whether the call ended (done or failed).
    pub fn ended(&self) -> bool {
        matches!(self.state, CallState::Done | CallState::Failed)
    }
}

impl Trace {
    /// The dump as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Reads a dump.
    pub fn from_json(text: &str) -> Result<Trace> {
        serde_json::from_str(text)
            .map_err(|e| Error::InvalidArgument(format!("not an oxccl trace: {e}")))
    }

    /// Reads every `*.json` dump in `dir` (files that are not dumps are skipped).
    pub fn read_dir(dir: &Path) -> Result<Vec<Trace>> {
        let io = |what: String| move |source| Error::Io { what, source };
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).map_err(io(format!("read {}", dir.display())))? {
            let path = e.map_err(io(format!("read {}", dir.display())))?.path();
            if path.extension().is_none_or(|x| x != "json") {
                continue;
            }
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            // A dump of MAX_ENTRIES calls is well under 1 GiB; anything bigger is not ours.
            if !meta.is_file() || meta.len() > 1 << 30 {
                continue;
            }
            if let Ok(t) = std::fs::read_to_string(&path)
                .map_err(|_| ())
                .and_then(|s| Trace::from_json(&s).map_err(|_| ()))
            {
                out.push(t);
            }
        }
        out.sort_by(|a, b| (&a.comm, a.rank).cmp(&(&b.comm, b.rank)));
        Ok(out)
    }

    /// The file name of this dump in a trace directory: `<comm>.rank<r>.json`.
    pub fn file_name(&self) -> String {
        format!("{}.rank{}.json", self.comm, self.rank)
    }
}

/// The default dump directory: `$TMPDIR/oxccl-trace-<uid>`.
pub fn default_dir() -> PathBuf {
    std::env::temp_dir().join(format!(
        "oxccl-trace-{}",
        rustix::process::getuid().as_raw()
    ))
}

// ---- the recorder ----

/// Marks a call in a recorder; [`Mark::NONE`] when nothing was recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mark(u64);

impl Mark {
    pub(crate) const NONE: Mark = Mark(u64::MAX);
}

/// One call's words. `version` is the sequence lock; the rest is the entry.
#[derive(Default)]
struct Slot {
    version: AtomicU64,
    id: AtomicU64,
    seq: AtomicU64,
    /// kind | collective | dtype | op | in place | route (see `pack_what`).
    what: AtomicU64,
    count: AtomicU64,
    /// Root, or first peer | peers << 32.
    who: AtomicU64,
    /// state | (peer + 1) << 8 | step << 36.
    state: AtomicU64,
    begin: AtomicU64,
    end: AtomicU64,
}

const KIND_COLLECTIVE: u64 = 1;
const KIND_P2P: u64 = 2;
const ROUTE_AREA: u64 = 1;
const ROUTE_SCHEDULE: u64 = 2;
const ROUTE_DEVICE: u64 = 3;
const NO_ID: u64 = u64::MAX;

const S_QUEUED: u64 = 1;
const S_RUNNING: u64 = 2;
const S_WAITING: u64 = 3;
const S_DONE: u64 = 4;
const S_FAILED: u64 = 5;
/// The end time of a call recorded by [`Recorder::done_untimed`], and the begin time of a
/// call of the one-turn lane ([`Recorder::lane_call`]) until it waits or fails.
const UNTIMED: u64 = u64::MAX;

/// What a change of a call's state does to its end time.
#[derive(Clone, Copy)]
enum End {
    /// Still running: none.
    Open,
    /// Ended now: the clock.
    Now,
}
const PEER_BITS: u32 = 28;
const STEP_MAX: u64 = (1 << 28) - 1;

fn pack_state(code: u64, peer: Option<Rank>, step: Option<u64>) -> u64 {
    let peer = peer.map_or(0, |p| (p as u64 + 1).min((1 << PEER_BITS) - 1));
    let step = step.map_or(0, |s| s.min(STEP_MAX - 1) + 1);
    code | peer << 8 | step << (8 + PEER_BITS)
}

fn unpack_state(w: u64) -> (u64, Option<Rank>, Option<u64>) {
    let peer = (w >> 8) & ((1 << PEER_BITS) - 1);
    let step = w >> (8 + PEER_BITS);
    (
        w & 0xFF,
        (peer > 0).then(|| (peer - 1) as Rank),
        (step > 0).then(|| step - 1),
    )
}

fn pack_what(kind: u64, plan: Option<&Plan>, route: Option<Route>) -> u64 {
    let mut w = kind;
    if let Some(p) = plan {
        w |= (p.collective as u64) << 8
            | (p.dtype as u64) << 16
            | (p.op as u64) << 24
            | u64::from(p.in_place) << 32;
    }
    match route {
        Some(Route::Area(way)) => w |= ROUTE_AREA << 40 | (way as u64) << 48,
        Some(Route::Schedule(c)) => {
            w |= ROUTE_SCHEDULE << 40 | (c.algorithm as u64) << 48 | (c.leg as u64) << 56
        }
        Some(Route::Device(d)) => w |= ROUTE_DEVICE << 40 | (d as u64) << 48,
        None => {}
    }
    w
}

fn byte(w: u64, at: u32) -> u64 {
    (w >> at) & 0xFF
}

/// A communicator's flight recorder. See the module docs.
pub(crate) struct Recorder {
    /// A power of two at least `keep` long (a mask, not a division, finds a call's slot).
    slots: Box<[Slot]>,
    /// Calls a snapshot shows (the configured number).
    keep: u64,
    clock: Clock,
    next: AtomicU64,
    /// The first entry a snapshot shows ([`Recorder::forget`]).
    floor: AtomicU64,
    /// The entry of the call running now (`NO_ID`: none).
    current: AtomicU64,
    start_unix_ns: u64,
    rank: Rank,
    size: usize,
    comm: String,
    dir: PathBuf,
    /// `dir` is the default one (in the shared temporary directory).
    default_dir: bool,
    /// Whether a failure already wrote a dump (one per communicator).
    dumped: AtomicBool,
    /// The error that failed the communicator, and its kind.
    error: Mutex<Option<(String, &'static str)>>,
}

impl Recorder {
    /// A recorder of `config.trace_entries` calls (none: every method does nothing) for `rank`
    /// of `size` of the communicator tagged `comm`; registered for SIGUSR1 when asked.
    pub(crate) fn new(config: &Config, rank: Rank, size: usize, comm: String) -> Arc<Recorder> {
        let entries = config.trace_entries.min(MAX_ENTRIES);
        let slots = if entries == 0 {
            0
        } else {
            entries.next_power_of_two()
        };
        let r = Arc::new(Recorder {
            slots: (0..slots).map(|_| Slot::default()).collect(),
            keep: entries as u64,
            clock: Clock::new(),
            next: AtomicU64::new(0),
            floor: AtomicU64::new(0),
            current: AtomicU64::new(NO_ID),
            start_unix_ns: unix_ns(),
            rank,
            size,
            comm,
            dir: config.trace_dir.clone().unwrap_or_else(default_dir),
            default_dir: config.trace_dir.is_none(),
            dumped: AtomicBool::new(false),
            error: Mutex::new(None),
        });
        if entries > 0 && config.trace_signal {
            signal::register(&r);
        }
        r
    }

    /// A recorder that keeps nothing.
    pub(crate) fn off(rank: Rank) -> Arc<Recorder> {
        Recorder::new(&Config::default().trace_entries(0), rank, 0, String::new())
    }

    #[inline]
    fn now(&self) -> u64 {
        self.clock.ticks()
    }

    #[inline]
    fn index(&self, id: u64) -> usize {
        (id & (self.slots.len() as u64 - 1)) as usize
    }

    /// Writes slot `id`'s words through its sequence lock.
    #[inline]
    fn write(&self, id: u64, f: impl FnOnce(&Slot)) {
        let s = &self.slots[self.index(id)];
        let v = s.version.load(Ordering::Relaxed);
        s.version.store(v.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        f(s);
        s.version.store(v.wrapping_add(2), Ordering::Release);
    }

    /// The slot of `m` if it still holds that call.
    #[inline]
    fn slot(&self, m: Mark) -> Option<&Slot> {
        if m == Mark::NONE || self.slots.is_empty() {
            return None;
        }
        let s = &self.slots[self.index(m.0)];
        (s.id.load(Ordering::Relaxed) == m.0).then_some(s)
    }

    #[inline]
    fn begin(&self, seq: u64, what: u64, count: u64, who: u64, running: bool) -> Mark {
        if self.slots.is_empty() {
            return Mark::NONE;
        }
        let t = self.now();
        self.begin_at(t, (seq, what, count, who), running)
    }

    /// [`Recorder::begin`] with begin time `t` (a reading, or [`UNTIMED`]).
    #[inline(always)]
    fn begin_at(
        &self,
        t: u64,
        (seq, what, count, who): (u64, u64, u64, u64),
        running: bool,
    ) -> Mark {
        let id = self.next.load(Ordering::Relaxed);
        self.next.store(id + 1, Ordering::Relaxed);
        let state = if running { S_RUNNING } else { S_QUEUED };
        self.write(id, |s| {
            s.id.store(id, Ordering::Relaxed);
            s.seq.store(seq, Ordering::Relaxed);
            s.what.store(what, Ordering::Relaxed);
            s.count.store(count, Ordering::Relaxed);
            s.who.store(who, Ordering::Relaxed);
            s.state.store(state, Ordering::Relaxed);
            s.begin.store(t, Ordering::Relaxed);
            s.end.store(0, Ordering::Relaxed);
        });
        if running {
            self.current.store(id, Ordering::Relaxed);
        }
        Mark(id)
    }

    /// Records collective `seq` of `plan` on `route`, running now or queued.
    #[inline]
    pub(crate) fn collective(&self, seq: u64, plan: &Plan, route: Route, running: bool) -> Mark {
        self.begin(
            seq,
            pack_what(KIND_COLLECTIVE, Some(plan), Some(route)),
            plan.count as u64,
            plan.root as u64,
            running,
        )
    }

    /// Records collective `seq` of `plan` on `route`, a call of the area's one-turn lane
    /// running now, without reading the clock: its begin is read if it waits
    /// ([`Recorder::waits`]) or fails, its end only if it fails ([`Recorder::done_untimed`]).
    #[inline]
    pub(crate) fn lane_call(&self, seq: u64, plan: &Plan, route: Route) -> Mark {
        if self.slots.is_empty() {
            return Mark::NONE;
        }
        let what = pack_what(KIND_COLLECTIVE, Some(plan), Some(route));
        self.begin_at(
            UNTIMED,
            (seq, what, plan.count as u64, plan.root as u64),
            true,
        )
    }

    /// The running call waits for the first time: a lane call ([`Recorder::lane_call`])
    /// takes its begin time now.
    #[cold]
    pub(crate) fn waits(&self) {
        let m = Mark(self.current.load(Ordering::Relaxed));
        let Some(s) = self.slot(m) else { return };
        if s.begin.load(Ordering::Relaxed) == UNTIMED {
            let t = self.now();
            self.write(m.0, |s| s.begin.store(t, Ordering::Relaxed));
        }
    }

    /// Records a point-to-point group (queued) with `peers`; `seq` is its number with the first.
    pub(crate) fn point_to_point(&self, seq: u64, peers: &[Rank]) -> Mark {
        let first = peers.first().map_or(0, |&p| p as u64 & 0xFFFF_FFFF);
        let n = (peers.len() as u64).min(0xFFFF_FFFF);
        self.begin(
            seq,
            pack_what(KIND_P2P, None, None),
            0,
            first | n << 32,
            false,
        )
    }

    fn set_state(&self, m: Mark, state: u64, end: End) {
        let Some(s) = self.slot(m) else { return };
        let old = s.state.load(Ordering::Relaxed) & 0xFF;
        if old == S_DONE || old == S_FAILED {
            return;
        }
        let t = match end {
            End::Open => None,
            End::Now => Some(self.now()),
        };
        // A lane call not timed yet that ends now (it failed, or the general path took it:
        // at most a slot of data either way) began little before.
        let begin = (matches!(end, End::Now) && s.begin.load(Ordering::Relaxed) == UNTIMED)
            .then_some(t)
            .flatten();
        self.write(m.0, |s| {
            s.state.store(state, Ordering::Relaxed);
            if let Some(t) = t {
                s.end.store(t, Ordering::Relaxed);
            }
            if let Some(b) = begin {
                s.begin.store(b, Ordering::Relaxed);
            }
        });
    }

    /// The queued call `m` starts.
    pub(crate) fn start(&self, m: Mark) {
        if m == Mark::NONE {
            return;
        }
        self.current.store(m.0, Ordering::Relaxed);
        self.set_state(m, S_RUNNING, End::Open);
    }

    /// The running call is idle, waiting for `peer` after `step` steps.
    pub(crate) fn waiting(&self, peer: Option<Rank>, step: Option<u64>) {
        let m = Mark(self.current.load(Ordering::Relaxed));
        self.set_state(m, pack_state(S_WAITING, peer, step), End::Open);
    }

    /// Call `m` ended with `result`.
    #[inline]
    pub(crate) fn end(&self, m: Mark, result: &Result<()>) {
        match result {
            Ok(()) => self.finish(m, S_DONE, End::Now),
            Err(e) => self.finish(m, pack_state(S_FAILED, culprit(e), None), End::Now),
        }
    }

    /// Call `m` succeeded; its end time is not read (a clock read is a noticeable part of a
    /// small call). For the calls of the area's one-turn lane, which end within a turn of
    /// their begin unless a peer is late; their entries show no `end_ns`.
    #[inline]
    pub(crate) fn done_untimed(&self, m: Mark) {
        // `finish` for this one case, inline (a call of every small collective).
        let Some(s) = self.slot(m) else { return };
        let old = s.state.load(Ordering::Relaxed) & 0xFF;
        if old == S_DONE || old == S_FAILED {
            return;
        }
        self.write(m.0, |s| {
            s.state.store(S_DONE, Ordering::Relaxed);
            s.end.store(UNTIMED, Ordering::Relaxed);
        });
        if self.current.load(Ordering::Relaxed) == m.0 {
            self.current.store(NO_ID, Ordering::Relaxed);
        }
    }

    fn finish(&self, m: Mark, state: u64, end: End) {
        if m == Mark::NONE {
            return;
        }
        self.set_state(m, state, end);
        if self.current.load(Ordering::Relaxed) == m.0 {
            self.current.store(NO_ID, Ordering::Relaxed);
        }
    }

    /// The communicator failed with `e` during the running call: marks it failed, and on a
    /// timeout, a failed peer or a mismatch, writes the dump (once per communicator).
    pub(crate) fn failed(&self, e: &Error) {
        if self.slots.is_empty() {
            return;
        }
        let m = Mark(self.current.load(Ordering::Relaxed));
        self.finish(m, pack_state(S_FAILED, culprit(e), None), End::Now);
        let reason = match e {
            Error::Timeout { .. } => "timeout",
            Error::PeerFailed { .. } => "peer failed",
            Error::Mismatch { .. } => "mismatch",
            _ => return,
        };
        *self.error.lock().unwrap_or_else(|p| p.into_inner()) = Some((e.to_string(), reason));
        if self.dumped.swap(true, Ordering::AcqRel) {
            return;
        }
        match self.dump(reason) {
            Ok(path) => tracing::warn!(
                rank = self.rank,
                "flight recorder: wrote the last {} calls to {} (oxccl-trace {} names the culprit)",
                self.keep,
                path.display(),
                self.dir.display()
            ),
            Err(e) => tracing::warn!(rank = self.rank, "flight recorder: {e}"),
        }
    }

    /// Leaves out of every later snapshot the calls recorded so far (the ones a communicator
    /// makes to probe or calibrate itself at creation, which the caller never made). Called
    /// with the communicator's state lock held, no call running.
    pub(crate) fn forget(&self) {
        self.floor
            .store(self.next.load(Ordering::Relaxed), Ordering::Relaxed);
        self.current.store(NO_ID, Ordering::Relaxed);
    }

    /// A copy of the kept calls.
    pub(crate) fn snapshot(&self, reason: &str) -> Trace {
        let ns = self.clock.to_ns();
        let dumped_ns = ns(self.now());
        let failure = self.error.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let (next, floor) = (
            self.next.load(Ordering::Relaxed),
            self.floor.load(Ordering::Relaxed),
        );
        let oldest = next.saturating_sub(self.keep).max(floor);
        let recorded = next.saturating_sub(floor);
        let mut entries: Vec<TraceEntry> = self
            .slots
            .iter()
            .filter_map(|s| self.read(s))
            .filter(|e| e.id >= oldest)
            .map(|mut e| {
                e.begin_ns = e.begin_ns.map(&ns);
                e.end_ns = e.end_ns.map(&ns);
                e
            })
            .collect();
        entries.sort_by_key(|e| e.id);
        Trace {
            format: FORMAT,
            comm: self.comm.clone(),
            rank: self.rank,
            size: self.size,
            host: crate::topo::host_name(),
            pid: std::process::id(),
            reason: reason.into(),
            error: failure.as_ref().map(|f| f.0.clone()),
            failure: failure.map(|f| f.1.to_string()),
            start_unix_ns: self.start_unix_ns,
            dumped_ns,
            recorded,
            entries,
        }
    }

    /// Writes the snapshot to `<dir>/<comm>.rank<r>.json` (the directory made private to this
    /// user if it is new) and returns the path.
    pub(crate) fn dump(&self, reason: &str) -> Result<PathBuf> {
        use std::io::Write;
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
        static TEMP: AtomicU64 = AtomicU64::new(0);
        let t = self.snapshot(reason);
        let what = |w: &str| {
            format!(
                "rank {}: flight recorder: {w} {}",
                self.rank,
                self.dir.display()
            )
        };
        let io = |what: String| move |source| Error::Io { what, source };
        if !self.dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&self.dir)
                .map_err(io(what("create")))?;
        }
        // The default directory sits in a shared temporary directory: it must be this user's
        // own, not a link, and writable by nobody else (someone else's would let them read or
        // replace the dumps).
        if self.default_dir {
            let m = std::fs::symlink_metadata(&self.dir).map_err(io(what("inspect")))?;
            let uid = rustix::process::geteuid().as_raw();
            if !m.is_dir() || m.uid() != uid || m.mode() & 0o022 != 0 {
                return Err(Error::Io {
                    what: what("use"),
                    source: std::io::Error::other(format!(
                        "not a directory of this user (uid {uid}) that only it may write to; \
                         set OXCCL_TRACE_DIR"
                    )),
                });
            }
        }
        let path = self.dir.join(t.file_name());
        // Written to a new file of our own (never through a link someone placed) and renamed,
        // so a reader never sees half a dump and two dumps at once never share a file.
        let tmp = self.dir.join(format!(
            ".{}.{}.{}",
            t.file_name(),
            t.pid,
            TEMP.fetch_add(1, Ordering::Relaxed)
        ));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(&tmp)
            .and_then(|mut f| f.write_all(t.to_json().as_bytes()))
            .and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(io(what("write into"))(e));
        }
        Ok(path)
    }

    /// Reads one slot through its sequence lock (a few tries; `None` if it keeps moving or
    /// holds nothing).
    fn read(&self, s: &Slot) -> Option<TraceEntry> {
        for _ in 0..64 {
            let v1 = s.version.load(Ordering::Acquire);
            if v1 == 0 {
                return None;
            }
            if v1 % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let words = [
                s.id.load(Ordering::Relaxed),
                s.seq.load(Ordering::Relaxed),
                s.what.load(Ordering::Relaxed),
                s.count.load(Ordering::Relaxed),
                s.who.load(Ordering::Relaxed),
                s.state.load(Ordering::Relaxed),
                s.begin.load(Ordering::Relaxed),
                s.end.load(Ordering::Relaxed),
            ];
            fence(Ordering::Acquire);
            if s.version.load(Ordering::Relaxed) == v1 {
                return Some(decode(words));
            }
        }
        None
    }
}

/// The recorder's clock: the time-stamp counter where it runs at a constant rate on every
/// core (a third of a clock_gettime's cost), else the monotonic clock. Either way
/// [`Clock::ns_per_tick`] turns differences of its readings into nanoseconds. Public for
/// benchmarks that time each call (allreduce-perf), where a clock_gettime is a noticeable part
/// of a small call.
#[derive(Debug)]
pub struct Clock {
    tsc: bool,
    start_ticks: u64,
    start: Instant,
}

impl Default for Clock {
    fn default() -> Clock {
        Clock::new()
    }
}

impl Clock {
    /// A clock starting now.
    pub fn new() -> Clock {
        let tsc = cfg!(target_arch = "x86_64") && invariant_tsc();
        let start = Instant::now();
        let mut c = Clock {
            tsc,
            start_ticks: 0,
            start,
        };
        c.start_ticks = c.ticks();
        c
    }

    /// A reading, in ticks of the clock's own rate.
    #[inline]
    pub fn ticks(&self) -> u64 {
        #[cfg(target_arch = "x86_64")]
        if self.tsc {
            // SAFETY: RDTSC has no preconditions; every x86-64 processor has it.
            return unsafe { std::arch::x86_64::_rdtsc() };
        }
        self.start.elapsed().as_nanos() as u64
    }

    /// Nanoseconds per tick, as seen between the start and now (1 on the monotonic clock).
    pub fn ns_per_tick(&self) -> f64 {
        if self.tsc {
            let (ns, ticks) = (self.start.elapsed().as_nanos() as f64, self.ticks());
            ns / (ticks.saturating_sub(self.start_ticks).max(1) as f64)
        } else {
            1.0
        }
    }

    /// Converts readings to nanoseconds since the start, scaling ticks by the rate seen
    /// between the start and now.
    fn to_ns(&self) -> impl Fn(u64) -> u64 + use<> {
        let (tsc, t0) = (self.tsc, self.start_ticks);
        let rate = self.ns_per_tick();
        move |t| {
            if tsc {
                (t.saturating_sub(t0) as f64 * rate) as u64
            } else {
                t
            }
        }
    }
}

/// Whether /proc/cpuinfo says the time-stamp counter ticks at one rate on every core, in
/// every power state.
fn invariant_tsc() -> bool {
    static TSC: OnceLock<bool> = OnceLock::new();
    *TSC.get_or_init(|| {
        std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|s| {
            s.lines().find(|l| l.starts_with("flags")).is_some_and(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.contains(&"constant_tsc") && f.contains(&"nonstop_tsc")
            })
        })
    })
}

/// The entry the words of a slot describe.
fn decode([id, seq, what, count, who, state, begin, end]: [u64; 8]) -> TraceEntry {
    let collective = (what & 0xFF == KIND_COLLECTIVE)
        .then(|| {
            Collective::ALL
                .into_iter()
                .find(|c| *c as u64 == byte(what, 8))
        })
        .flatten();
    let dtype = collective.and_then(|_| {
        DataType::ALL
            .into_iter()
            .find(|d| *d as u64 == byte(what, 16))
    });
    let op = collective.filter(|c| c.reduces()).and_then(|_| {
        ReduceOp::ALL
            .into_iter()
            .find(|o| *o as u64 == byte(what, 24))
    });
    let route = match byte(what, 40) {
        ROUTE_AREA => Way::ALL
            .into_iter()
            .find(|w| *w as u64 == byte(what, 48))
            .map(Route::Area),
        ROUTE_SCHEDULE => {
            let alg = |b| Algorithm::ALL.into_iter().find(|a| *a as u64 == b);
            alg(byte(what, 48)).map(|a| {
                let mut c = crate::algo::Choice::new(a);
                c.leg = alg(byte(what, 56)).unwrap_or(c.leg);
                Route::Schedule(c)
            })
        }
        ROUTE_DEVICE => [DeviceWay::Native, DeviceWay::Staged]
            .into_iter()
            .find(|d| *d as u64 == byte(what, 48))
            .map(Route::Device),
        _ => None,
    };
    let (code, peer, step) = unpack_state(state);
    let p2p = what & 0xFF == KIND_P2P;
    TraceEntry {
        id,
        kind: if p2p {
            CallKind::PointToPoint
        } else {
            CallKind::Collective
        },
        seq,
        collective: collective.map(|c| c.name().to_string()),
        dtype: dtype.map(|d| d.name().to_string()),
        count,
        op: op.map(|o| o.name().to_string()),
        root: collective.filter(|c| c.rooted()).map(|_| who as Rank),
        in_place: (what >> 32) & 1 == 1,
        route: collective.and_then(|c| route.map(|r| r.name_for(c))),
        peers: if p2p {
            vec![(who & 0xFFFF_FFFF) as Rank]
        } else {
            Vec::new()
        },
        npeers: if p2p { (who >> 32) as usize } else { 0 },
        state: match code {
            S_QUEUED => CallState::Queued,
            S_WAITING => CallState::Waiting,
            S_DONE => CallState::Done,
            S_FAILED => CallState::Failed,
            _ => CallState::Running,
        },
        peer,
        step,
        begin_ns: (begin != UNTIMED).then_some(begin),
        end_ns: (code == S_DONE || code == S_FAILED)
            .then_some(end)
            .filter(|&e| e != UNTIMED),
    }
}

/// The rank an error blames, if any.
fn culprit(e: &Error) -> Option<Rank> {
    match e {
        Error::Timeout { peer, .. } => *peer,
        Error::PeerFailed { peer, .. } | Error::Mismatch { peer, .. } => Some(*peer),
        _ => None,
    }
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The tag of a communicator: the same on all its ranks, different for other communicators of
/// the job (another namespace) and, with overwhelming likelihood, for other jobs (another
/// secret). The secret cannot be recovered from it.
pub(crate) fn comm_tag(namespace: &str, secret: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let d = Sha256::new()
        .chain_update(b"oxccl flight recorder\0")
        .chain_update(secret)
        .chain_update(namespace.as_bytes())
        .finalize();
    d[..6].iter().map(|b| format!("{b:02x}")).collect()
}

/// A recorder as the 8-byte call path uses it, for `benches/trace.rs` (not an API).
#[doc(hidden)]
pub struct BenchRecorder(Arc<Recorder>);

impl BenchRecorder {
    /// A recorder of `entries` calls (not registered for SIGUSR1).
    pub fn new(entries: usize) -> BenchRecorder {
        let c = Config::default().trace_entries(entries).trace_signal(false);
        BenchRecorder(Recorder::new(&c, 0, 2, "bench".into()))
    }

    /// Records all-reduce `seq` of `plan` through the shared area, and its success: what
    /// `Communicator::run` adds to a call that takes the area's fast path.
    #[inline]
    pub fn call(&self, seq: u64, plan: &Plan) {
        let m = self
            .0
            .collective(seq, plan, Route::Area(Way::OneShot), true);
        self.0.end(m, &Ok(()));
    }

    /// The recorder's dump.
    pub fn snapshot(&self) -> Trace {
        self.0.snapshot("requested")
    }
}

/// SIGUSR1: a thread of ours waits for it and dumps every live recorder.
mod signal {
    use super::*;

    static LIVE: Mutex<Vec<Weak<Recorder>>> = Mutex::new(Vec::new());
    static STARTED: OnceLock<bool> = OnceLock::new();

    pub(super) fn register(r: &Arc<Recorder>) {
        {
            let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
            live.retain(|w| w.strong_count() > 0);
            live.push(Arc::downgrade(r));
        }
        STARTED.get_or_init(|| {
            let signals = match signal_hook::iterator::Signals::new([signal_hook::consts::SIGUSR1])
            {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!("flight recorder: cannot take SIGUSR1: {e}");
                    return false;
                }
            };
            std::thread::Builder::new()
                .name("oxccl-sigusr1".into())
                .spawn(move || {
                    let mut signals = signals;
                    for _ in signals.forever() {
                        let live: Vec<Arc<Recorder>> = LIVE
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .iter()
                            .filter_map(Weak::upgrade)
                            .collect();
                        for r in live {
                            match r.dump("SIGUSR1") {
                                Ok(p) => tracing::warn!(
                                    rank = r.rank,
                                    "flight recorder: SIGUSR1: wrote {}",
                                    p.display()
                                ),
                                Err(e) => {
                                    tracing::warn!(rank = r.rank, "flight recorder: SIGUSR1: {e}")
                                }
                            }
                        }
                    }
                })
                .is_ok()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::Choice;

    fn recorder(n: usize) -> Arc<Recorder> {
        let c = Config::default().trace_entries(n).trace_signal(false);
        Recorder::new(&c, 1, 4, "t".into())
    }

    #[test]
    fn a_lane_call_is_timed_only_once_it_waits_or_fails() {
        let r = recorder(8);
        let plan = Plan::new(Collective::Broadcast, 2, DataType::F32);
        let route = Route::Area(Way::Staged);
        // Never waits: no time at all.
        let m0 = r.lane_call(0, &plan, route);
        r.done_untimed(m0);
        // Waits (twice; the first wait times it): a begin, no end.
        let before = r.now();
        let m1 = r.lane_call(1, &plan, route);
        r.waits();
        let ticks = |m: Mark| r.slots[r.index(m.0)].begin.load(Ordering::Relaxed);
        let first = ticks(m1);
        r.waits();
        assert_eq!(ticks(m1), first, "a second wait does not time it again");
        r.done_untimed(m1);
        // Fails without waiting: begin and end, at its failure.
        let m2 = r.lane_call(2, &plan, route);
        r.end(m2, &Err(Error::InvalidArgument("x".into())));
        // A timed call is not re-timed by a wait.
        let m3 = r.collective(3, &plan, route, true);
        let t3 = ticks(m3);
        r.waits();
        assert_eq!(ticks(m3), t3);
        r.end(m3, &Ok(()));
        let t = r.snapshot("requested");
        let e = &t.entries;
        assert_eq!(e.len(), 4);
        assert_eq!(
            (e[0].state, e[0].begin_ns, e[0].end_ns),
            (CallState::Done, None, None)
        );
        // (Nanoseconds are scaled by the rate seen at each snapshot: compare within one.)
        assert!(first != UNTIMED && first >= before);
        assert!(e[1].begin_ns.is_some() && e[1].end_ns.is_none(), "{e:?}");
        assert_eq!(e[2].state, CallState::Failed);
        assert!(
            e[2].begin_ns.is_some() && e[2].begin_ns == e[2].end_ns,
            "{e:?}"
        );
        assert!(e[2].begin_ns >= e[1].begin_ns);
        assert!(
            e[3].begin_ns >= e[2].end_ns && e[3].end_ns >= e[3].begin_ns,
            "{e:?}"
        );
        // blame's and oxccl-trace's readers take entries without a begin (the JSON round trip).
        let back: Trace = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
        assert_eq!(back.entries[0].begin_ns, None);
        assert_eq!(back.entries, t.entries);
    }

    #[test]
    fn a_call_done_untimed_has_no_end_and_keeps_a_failure() {
        let r = recorder(8);
        let plan = Plan::new(Collective::Broadcast, 2, DataType::F32);
        let m = r.collective(0, &plan, Route::Area(Way::Staged), true);
        r.done_untimed(m);
        let m1 = r.collective(1, &plan, Route::Area(Way::Staged), true);
        r.end(m1, &Ok(()));
        let m2 = r.collective(2, &plan, Route::Area(Way::Staged), true);
        r.end(m2, &Err(Error::InvalidArgument("x".into())));
        r.done_untimed(m2); // does not undo the failure
        r.done_untimed(Mark::NONE);
        let t = r.snapshot("requested");
        let got: Vec<_> = t
            .entries
            .iter()
            .map(|e| (e.state, e.end_ns.is_some()))
            .collect();
        assert_eq!(
            got,
            [
                (CallState::Done, false),
                (CallState::Done, true),
                (CallState::Failed, true)
            ]
        );
        // No call is running any more.
        r.waiting(Some(1), None);
        let again = r.snapshot("requested");
        let states: Vec<_> = again.entries.iter().map(|e| (e.state, e.peer)).collect();
        assert_eq!(
            states,
            [
                (CallState::Done, None),
                (CallState::Done, None),
                (CallState::Failed, None)
            ]
        );
        assert_eq!(Trace::from_json(&t.to_json()).unwrap(), t);
    }

    #[test]
    fn forgotten_calls_leave_the_snapshots() {
        let r = recorder(8);
        let plan = Plan::new(Collective::AllReduce, 2, DataType::F32);
        for seq in 0..5 {
            let m = r.collective(seq, &plan, Route::Area(Way::OneShot), true);
            r.end(m, &Ok(()));
        }
        r.forget();
        let t = r.snapshot("requested");
        assert!(t.entries.is_empty() && t.recorded == 0, "{t:?}");
        let m = r.collective(0, &plan, Route::Area(Way::OneShot), true);
        r.end(m, &Ok(()));
        let t = r.snapshot("requested");
        assert_eq!(t.recorded, 1);
        let names: Vec<String> = t.entries.iter().map(TraceEntry::name).collect();
        assert_eq!(names, ["all_reduce #0"]);
    }

    #[test]
    fn entries_decode_what_was_recorded() {
        let r = recorder(8);
        let plan = Plan::new(Collective::Broadcast, 12, DataType::BF16).root(3);
        let mut choice = Choice::new(Algorithm::Hierarchical);
        choice.leg = Algorithm::Direct;
        let m = r.collective(7, &plan, Route::Schedule(choice), false);
        r.start(m);
        r.waiting(Some(2), Some(5));
        let a = Plan::new(Collective::AllReduce, 3, DataType::F32)
            .op(ReduceOp::Max)
            .in_place(true);
        let p = r.point_to_point(4, &[2, 0, 3]);
        let t = r.snapshot("requested");
        assert_eq!(t.entries.len(), 2);
        let e = &t.entries[0];
        assert_eq!(e.name(), "broadcast #7");
        assert_eq!(
            (e.dtype.as_deref(), e.count, e.root, e.op.as_deref()),
            (Some("bfloat16"), 12, Some(3), None)
        );
        assert_eq!(e.route.as_deref(), Some("hierarchical"));
        assert_eq!(
            (e.state, e.peer, e.step),
            (CallState::Waiting, Some(2), Some(5))
        );
        assert_eq!(e.end_ns, None);
        assert_eq!(t.entries[1].kind, CallKind::PointToPoint);
        assert_eq!(t.entries[1].name(), "point-to-point with rank 2 and 2 more");
        r.end(m, &Ok(()));
        r.end(p, &Ok(()));
        let m2 = r.collective(8, &a, Route::Area(Way::TwoShot), true);
        r.failed(&Error::Aborted {
            rank: 1,
            op: "x".into(),
            why: "y".into(),
        });
        r.end(m2, &Ok(())); // a late end does not undo the failure
        let t = r.snapshot("requested");
        let e = &t.entries[2];
        assert_eq!(e.name(), "all_reduce #8");
        assert_eq!(
            (e.op.as_deref(), e.in_place, e.route.as_deref(), e.state),
            (Some("max"), true, Some("shm two-shot"), CallState::Failed)
        );
        assert!(t.entries[0].end_ns.is_some() && t.entries[0].state == CallState::Done);
        let back = Trace::from_json(&t.to_json()).unwrap();
        assert_eq!(back, t);
        for (way, name) in [
            (DeviceWay::Native, "device"),
            (DeviceWay::Staged, "staged through host memory"),
        ] {
            let m = r.collective(9, &a.on_device(true), Route::Device(way), true);
            r.end(m, &Ok(()));
            let t = r.snapshot("requested");
            let e = t.entries.last().unwrap();
            assert_eq!(
                (e.name(), e.route.as_deref()),
                ("all_reduce #9".into(), Some(name))
            );
        }
    }

    #[test]
    fn the_ring_keeps_the_last_entries() {
        let r = recorder(4);
        let plan = Plan::new(Collective::AllReduce, 1, DataType::F32);
        for seq in 0..10 {
            let m = r.collective(seq, &plan, Route::Area(Way::OneShot), true);
            r.end(m, &Ok(()));
        }
        let t = r.snapshot("requested");
        assert_eq!(t.recorded, 10);
        assert_eq!(
            t.entries.iter().map(|e| e.seq).collect::<Vec<_>>(),
            [6, 7, 8, 9]
        );
        // Times are nanoseconds since the start, in call order, each call ending after it began.
        for w in t.entries.windows(2) {
            assert!(w[0].end_ns.unwrap() <= w[1].begin_ns.unwrap(), "{w:?}");
        }
        assert!(
            t.entries
                .iter()
                .all(|e| e.begin_ns.unwrap() <= e.end_ns.unwrap())
        );
        assert!(t.entries[3].end_ns.unwrap() <= t.dumped_ns);
        // Not a power of two: the last 3 are shown.
        let r3 = recorder(3);
        for seq in 0..10 {
            r3.collective(seq, &plan, Route::Area(Way::OneShot), true);
        }
        let seqs: Vec<u64> = r3.snapshot("x").entries.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [7, 8, 9]);
        // A mark whose slot was reused changes nothing.
        r.end(Mark(2), &Err(Error::InvalidArgument("x".into())));
        assert!(
            r.snapshot("x")
                .entries
                .iter()
                .all(|e| e.state == CallState::Done)
        );
    }

    #[test]
    fn no_entries_records_nothing() {
        let r = recorder(0);
        let plan = Plan::new(Collective::AllReduce, 1, DataType::F32);
        let m = r.collective(0, &plan, Route::Area(Way::OneShot), true);
        assert_eq!(m, Mark::NONE);
        r.end(m, &Ok(()));
        r.waiting(Some(1), Some(1));
        assert!(r.snapshot("x").entries.is_empty());
    }

    #[test]
    fn state_words_round_trip() {
        for (peer, step) in [
            (None, None),
            (Some(0), Some(0)),
            (Some(70_000), Some(1 << 40)),
        ] {
            let (c, p, s) = unpack_state(pack_state(S_WAITING, peer, step));
            assert_eq!((c, p), (S_WAITING, peer));
            assert_eq!(s, step.map(|s| s.min(STEP_MAX - 1)));
        }
    }

    #[test]
    fn a_reader_never_sees_a_torn_entry() {
        let r = recorder(2);
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let reader = {
            let (r, stop, seen) = (r.clone(), stop.clone(), seen.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for e in r.snapshot("x").entries {
                        // Each call's count, seq and root were written as one.
                        assert_eq!(e.count, e.seq * 3);
                        assert_eq!(e.root, Some((e.seq % 5) as Rank));
                        seen.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        };
        // At least 200 000 calls, and on until the reader has read some while they were
        // written (on a loaded machine its thread may not run during the first ones).
        let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
        for seq in 0u64.. {
            let plan = Plan::new(Collective::Reduce, (seq * 3) as usize, DataType::F32)
                .root((seq % 5) as Rank);
            let m = r.collective(seq, &plan, Route::Area(Way::Staged), true);
            r.end(m, &Ok(()));
            if seq >= 200_000
                && (seen.load(Ordering::Relaxed) > 1000 || std::time::Instant::now() > until)
            {
                break;
            }
        }
        stop.store(true, Ordering::Relaxed);
        reader.join().unwrap();
        assert!(seen.load(Ordering::Relaxed) > 0);
    }
}
