//! The [`Communicator`]: a group of ranks that run collectives together. This module is the
//! public face — creation, the call path, split, abort, drop — and holds no algorithm or socket
//! code: calls become [`Plan`]s, the tuner picks an algorithm, `algo` makes the schedule, and
//! the executor (`exec`) runs it over the links `setup` connected.
//!
//! # Thread safety
//!
//! A `Communicator` is `Send + Sync`. Calls from several threads are executed one at a time, in
//! the order they take the communicator's lock; since every rank must issue collectives in the
//! same order, issue them from one thread per communicator (use [`Communicator::split`] for
//! independent streams of collectives). [`Communicator::abort`] may be called from any thread at
//! any time and unblocks every waiting call with [`Error::Aborted`].

mod api;
#[cfg(feature = "cuda")]
mod device;
mod group;
mod liveness;
mod memory;
#[cfg(feature = "cuda")]
mod native;
mod raw;
mod setup;
mod tuning;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Duration;

pub use group::Group;
pub use memory::Registration;
#[cfg(feature = "cuda")]
pub use native::NativeCall;
pub use raw::{Pending, RawMessage};
pub use tuning::{Calibration, PROBE_ROUNDS};

use crate::algo::{self, Choice, Plan};
use crate::bootstrap::{MemStore, Rendezvous, Store, UniqueId};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::exec::descriptor::Descriptor;
use crate::exec::driver::Engine;
use crate::exec::flags::Flags;
use crate::exec::op::{OpName, OpResult, Operation, Work};
use crate::exec::progress::Compiled;
use crate::topo::Topology;
use crate::trace::{Recorder, Trace};
use crate::tune::{self, Costs, Decision, Route};
use crate::types::Rank;
use setup::Boot;

/// A group of ranks that run collectives together (NCCL's `ncclComm_t`, MPI's communicator).
///
/// Create one per rank with [`Communicator::init`] (from a launcher's environment),
/// [`Communicator::init_rank`] (from a [`UniqueId`]) or, for several ranks in one process,
/// [`Communicator::init_local`]. The collectives are methods (see `api`); dropping the
/// communicator closes its connections.
pub struct Communicator {
    pub(crate) inner: Arc<Inner>,
}

// Communicators are shared between threads (abort from any of them, async work driven by a
// progress thread): this stops compiling if a change makes that unsound.
const _: () = {
    const fn send_and_sync<T: Send + Sync>() {}
    send_and_sync::<Communicator>();
};

/// Shared by the communicator, its asynchronous work handles and its progress thread.
pub(crate) struct Inner {
    pub(crate) rank: Rank,
    pub(crate) size: usize,
    pub(crate) config: Config,
    pub(crate) topo: Topology,
    /// The ranks grouped by host, as the hierarchical schedules read them.
    pub(crate) hosts: algo::Hosts,
    pub(crate) flags: Arc<Flags>,
    state: Mutex<State>,
    boot: Boot,
    background: Background,
    /// What the routing decision may use, the same on every rank.
    means: tune::Means,
    /// Per peer, the transport of its link.
    link_names: Vec<Option<&'static str>>,
    /// The flight recorder (the engine holds it too).
    pub(crate) trace: Arc<Recorder>,
    /// The ranks' device group, where every rank is in this process (collectives on device
    /// memory then run on the device: `native`).
    #[cfg(feature = "cuda")]
    pub(crate) native: Option<Arc<native::DeviceGroup>>,
    /// The heartbeat watch (none between threads of one process, or when turned off); dropped
    /// with the communicator, saying goodbye to the neighbours.
    _liveness: Option<liveness::Liveness>,
}

/// Everything that changes per call, under one lock.
struct State {
    engine: Engine,
    /// Sequence number of the next collective.
    collectives: u64,
    /// Per peer, sequence number of the next point-to-point group involving it (for the
    /// flight recorder).
    groups: Vec<u64>,
    /// Per peer, how many messages this rank has queued to it and from it: the number of the
    /// next send's and the next receive's descriptor.
    sent: Vec<u64>,
    received: Vec<u64>,
    /// Number of splits so far (names the children's store namespaces).
    splits: u64,
    /// Number of shrinks so far (the same).
    shrinks: u64,
    /// Recently used schedules: the same call is planned once.
    cache: HashMap<(Plan, Choice), Arc<Compiled>>,
    /// What the tuner prices the ways through the group area with: the same on every rank
    /// (rank 0's, handed out at creation and after a calibration).
    costs: Costs,
    /// The (collective, size class, placement) whose candidates were logged (debug level).
    logged: std::collections::HashSet<(algo::Collective, u32, (bool, bool))>,
    /// Recent decisions by (collective, bytes, placement) — all a decision depends on besides
    /// what is fixed per communicator — so that repeated calls are not priced again.
    decided: [Option<Decided>; DECIDED],
    /// The schedules' simulated prices by (collective, size class).
    prices: tune::Prices,
}

/// Slots of [`State::decided`] (a power of two).
const DECIDED: usize = 64;

/// A cached decision: its [`decided_key`] and the decision.
type Decided = (u64, Decision);

/// Everything a routing decision depends on besides what is fixed per communicator —
/// collective, bytes, element type and operator (schedules are priced per type and operator),
/// placement (in place, on device) — in one word; `u64::MAX` (never cached) for sizes of 2^44
/// bytes or more. (Without the type and operator, a call of another type of the same size —
/// or an `explain` of one on one rank — left its decision for the next: a review, 2026-12-05.)
#[inline]
fn decided_key(plan: &Plan, bytes: usize) -> u64 {
    if bytes as u64 >= 1 << 44 {
        return u64::MAX;
    }
    (bytes as u64) << 20
        | (plan.op as u64) << 14
        | (plan.dtype as u64) << 8
        | (plan.collective as u64) << 2
        | u64::from(plan.in_place) << 1
        | u64::from(plan.on_device)
}
// The collective's, type's and operator's numbers fit the key's 6 bits each.
const _: () = {
    assert!(algo::Collective::ALL.len() <= 1 << 6);
    let mut i = 0;
    while i < crate::types::DataType::ALL.len() {
        assert!((crate::types::DataType::ALL[i] as u64) < 1 << 6);
        i += 1;
    }
    let mut i = 0;
    while i < crate::types::ReduceOp::ALL.len() {
        assert!((crate::types::ReduceOp::ALL[i] as u64) < 1 << 6);
        i += 1;
    }
};

const CACHE_ENTRIES: usize = 64;

/// The lazily started thread that drives asynchronous operations.
#[derive(Default)]
struct Background {
    started: AtomicBool,
    wake: Mutex<bool>,
    cv: Condvar,
    stop: AtomicBool,
}

/// The namespace of this rank's next communicator in a store it may have used before: a
/// counter per rank, so that the k-th creation on every rank meets the k-th on the others and
/// never reads the keys an earlier communicator left there (a UniqueId or MASTER_ADDR reused).
fn generation(store: &dyn Store, rank: Rank) -> Result<String> {
    let g = store.add(&format!("world/generation/{rank}"), 1)?;
    Ok(format!("world/{g}"))
}

impl Communicator {
    /// Creates this process's communicator from a launcher's environment: oxrun's `OXCCL_*`,
    /// torchrun, Slurm, Open MPI or PMI variables (see [`Rendezvous`]). Rank 0 hosts the store
    /// when the launcher does not; under torchrun, whose agent already serves a PyTorch
    /// `TCPStore` on `MASTER_PORT`, every rank is a client of that store.
    pub fn init(config: Config) -> Result<Communicator> {
        crate::logging::init();
        config.validate()?;
        let rv = Rendezvous::from_env()?.ok_or_else(|| {
            Error::Bootstrap(
                "no launcher environment found: run under oxrun, torchrun, srun or mpirun \
                 (or set OXCCL_RANK, OXCCL_WORLD_SIZE, OXCCL_STORE), or use init_rank / init_local"
                    .into(),
            )
        })?;
        Communicator::init_from(&rv, config)
    }

    /// Creates this process's communicator from a [`Rendezvous`] already read (with
    /// [`Rendezvous::from_vars`], say): what [`Communicator::init`] does after reading the
    /// environment.
    pub fn init_from(rv: &Rendezvous, config: Config) -> Result<Communicator> {
        crate::logging::init();
        config.validate()?;
        let deadline = std::time::Instant::now() + config.timeout;
        let opened = rv.open_store(deadline)?;
        let prefix = generation(&*opened.store, rv.rank)?;
        let boot = Boot::new(
            opened.store,
            prefix,
            opened.secret,
            None,
            Some(opened.addr),
            opened.server.map(Arc::new),
        );
        setup::init(boot, rv.rank, rv.world_size, config)
    }

    /// Creates rank `rank` of `nranks` from a [`UniqueId`] that one rank made with
    /// [`UniqueId::new`] and shared with the others (NCCL's `ncclCommInitRank`).
    pub fn init_rank(
        id: &UniqueId,
        nranks: usize,
        rank: Rank,
        config: Config,
    ) -> Result<Communicator> {
        crate::logging::init();
        config.validate()?;
        if nranks == 0 || nranks > crate::MAX_RANKS || rank >= nranks {
            return Err(Error::InvalidArgument(format!(
                "init_rank: rank {rank} of a communicator of {nranks} ranks (1 to {} ranks, \
                 each below the size)",
                crate::MAX_RANKS
            )));
        }
        let deadline = std::time::Instant::now() + config.timeout;
        // Requests without a deadline of their own wait as long as a call may.
        let store = id.connect(deadline)?.with_timeout(config.timeout);
        let prefix = generation(&store, rank)?;
        // Rank 0 keeps the id's server (if this process made it) where so configured.
        let server = (rank == 0 && config.unique_id_server_with_comm)
            .then(|| crate::bootstrap::unique_id::take_server(id))
            .flatten()
            .map(Arc::new);
        let boot = Boot::new(
            Arc::new(store),
            prefix,
            id.secret(),
            None,
            Some(id.store_addr()),
            server,
        );
        setup::init(boot, rank, nranks, config)
    }

    /// Creates `n` communicators that are ranks 0..n of one group inside this process
    /// (NCCL's `ncclCommInitAll`): for several devices per process, and for tests. By default
    /// they talk through in-process queues; `config.transports` can force TCP over loopback.
    pub fn init_local(n: usize, config: Config) -> Result<Vec<Communicator>> {
        crate::logging::init();
        config.validate()?;
        if n == 0 || n > crate::MAX_LOCAL_RANKS {
            return Err(Error::InvalidArgument(format!(
                "init_local: {n} ranks; from 1 to {} ranks run in one process",
                crate::MAX_LOCAL_RANKS
            )));
        }
        let store: Arc<dyn Store> = Arc::new(MemStore::new());
        let secret = oxccl_transport::auth::Secret::random()
            .map_err(|e| Error::Bootstrap(format!("init_local: {e}")))?;
        let hub = oxccl_transport::loopback::Hub::new();
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let boot = Boot::new(
                    store.clone(),
                    "local".into(),
                    secret.clone(),
                    Some(hub.clone()),
                    None,
                    None,
                );
                let config = config.clone();
                std::thread::Builder::new()
                    .name(format!("oxccl-init-{rank}"))
                    .spawn(move || setup::init(boot, rank, n, config))
                    .map_err(|e| Error::Io {
                        what: "init_local: spawn an init thread".into(),
                        source: e,
                    })
            })
            .collect::<Result<_>>()?;
        let mut comms = Vec::with_capacity(n);
        let mut first_error: Option<Error> = None;
        for h in handles {
            match h.join() {
                Ok(Ok(c)) => comms.push(c),
                Ok(Err(e)) => {
                    // A rank that failed for a cause of its own (a socket refused: no file
                    // descriptors left) left the others waiting for it in the store until the
                    // deadline: its error, not theirs, says what happened.
                    let waited =
                        |e: &Error| matches!(e, Error::Bootstrap(_) | Error::Timeout { .. });
                    if first_error
                        .as_ref()
                        .is_none_or(|f| waited(f) && !waited(&e))
                    {
                        first_error = Some(e);
                    }
                }
                Err(_) => {
                    first_error.get_or_insert(Error::Bootstrap(
                        "init_local: an init thread panicked".into(),
                    ));
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(comms),
        }
    }

    /// This rank's index, `0..size()`.
    pub fn rank(&self) -> Rank {
        self.inner.rank
    }

    /// The first peer this communicator has seen fail (its heartbeats went silent), and why;
    /// `None` while every watched peer is alive as far as it knows. Known without a call in
    /// flight: the next call that needs that peer fails with `PeerFailed` naming it. (In
    /// communicators of more than 16 ranks a rank watches two neighbours on each side only.)
    pub fn failed_peer(&self) -> Option<(Rank, String)> {
        self.inner.flags.lost()
    }

    /// Every peer this communicator has seen fail so far, in the order it saw them (the first
    /// is [`Communicator::failed_peer`]'s). For a caller waiting for some rank elsewhere, which
    /// must learn of that rank's failure even when another failed first.
    pub fn failed_peers(&self) -> Vec<Rank> {
        self.inner.flags.lost_all()
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.inner.size
    }

    /// How long any wait of this communicator's calls may last ([`Config::timeout`]).
    pub fn timeout(&self) -> Duration {
        self.inner.config.timeout
    }

    /// Where the ranks run.
    pub fn topology(&self) -> &Topology {
        &self.inner.topo
    }

    /// Per peer, the name of the transport that carries its link (`None` for this rank).
    pub fn transports(&self) -> &[Option<&'static str>] {
        &self.inner.link_names
    }

    /// How this communicator runs `plan`, the same on every rank and for every form of the
    /// call (blocking, asynchronous): the route the routing decision takes — through the shared
    /// area of ranks on one host, or a schedule with its algorithm and slicing (the one
    /// `OXCCL_ALGO` forces, where it applies) — and a line saying why.
    pub fn explain(&self, plan: &Plan) -> Decision {
        let mut st = self.inner.lock();
        self.inner.decide(&mut st, plan)
    }

    /// This rank's flight recorder: the communicator's last calls (up to
    /// [`Config::trace_entries`]) with their routes, states and times. See [`crate::trace`].
    pub fn trace(&self) -> Trace {
        self.inner.trace.snapshot("requested")
    }

    /// Writes [`Communicator::trace`] as JSON to the trace directory ([`Config::trace_dir`])
    /// as `<comm>.rank<r>.json` and returns the file's path.
    pub fn dump_trace(&self) -> Result<std::path::PathBuf> {
        self.inner.trace.dump("requested")
    }

    /// Aborts the communicator from any thread: every running and later call fails with
    /// [`Error::Aborted`], and every peer is told at once, idle or not (their running or next
    /// call fails with [`Error::PeerFailed`] naming this rank). Returns at once when nobody
    /// drives the communicator, else within a second (the driving thread tells the peers when
    /// it sees the abort). Irreversible; the connections close when the communicator is
    /// dropped. Not async-signal-safe.
    pub fn abort(&self) {
        self.inner.flags.abort();
        // A thread driving the engine sees the flag at its next pass (the flag's waker ends its
        // sleep) and tells the peers; when nobody drives, this thread does. Never blocks on
        // the running call: a call that must first wait for peers to stop touching its buffers
        // tells them itself once it can.
        let start = std::time::Instant::now();
        while !self.inner.flags.peers_told() && start.elapsed() < Duration::from_secs(1) {
            match self.inner.state.try_lock() {
                Ok(mut st) => return st.engine.abort_now(),
                Err(std::sync::TryLockError::Poisoned(p)) => {
                    return p.into_inner().engine.abort_now();
                }
                Err(std::sync::TryLockError::WouldBlock) => {
                    std::thread::sleep(Duration::from_micros(100));
                }
            }
        }
    }

    /// Splits this communicator (MPI_Comm_split): every rank calls it; ranks passing the same
    /// `color` form a new communicator, ordered by `key` and then by their rank here. A rank
    /// passing `None` joins none and gets `None`. The new communicator has this one's
    /// [`Config`].
    pub fn split(&self, color: Option<u32>, key: u32) -> Result<Option<Communicator>> {
        self.split_with(color, key, self.inner.config.clone())
    }

    /// [`Communicator::split`], the new communicator made with `config` (a subgroup's own
    /// timeout, say); the members must pass alike settings, as at any creation.
    pub fn split_with(
        &self,
        color: Option<u32>,
        key: u32,
        config: Config,
    ) -> Result<Option<Communicator>> {
        let me = [color.map_or(-1, i64::from), i64::from(key)];
        let mut all = vec![0i64; 2 * self.size()];
        self.all_gather(&me, &mut all)?;
        let split = {
            let mut st = self.inner.lock();
            st.splits += 1;
            st.splits
        };
        let Some(color) = color else { return Ok(None) };
        let mut members: Vec<(i64, Rank)> = (0..self.size())
            .filter(|&r| all[2 * r] == i64::from(color))
            .map(|r| (all[2 * r + 1], r))
            .collect();
        members.sort_unstable();
        let rank = members
            .iter()
            .position(|&(_, r)| r == self.rank())
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "rank {}: split lost track of this rank",
                    self.rank()
                ))
            })?;
        let boot = self.inner.boot.child(&format!("split{split}/color{color}"));
        setup::init(boot, rank, members.len(), config).map(Some)
    }

    /// A communicator of this one's ranks without those in `exclude` (NCCL's
    /// `ncclCommShrink`): what a job does to go on after [`Error::PeerFailed`] without a
    /// restart. Every rank not excluded calls it with the same list (in any order), on this
    /// communicator whether it failed or not; the survivors keep their order (a rank's new
    /// number is its position among them). It meets the others through the store, not the
    /// links, so the store must outlive the excluded ranks (oxrun's, torchrun's agent store,
    /// or the process that made the [`UniqueId`] — not a store hosted by an excluded rank).
    /// Ranks whose lists differ never meet (each list is its own namespace): they time out.
    pub fn shrink(&self, exclude: &[Rank]) -> Result<Communicator> {
        let me = self.rank();
        let mut ex = exclude.to_vec();
        ex.sort_unstable();
        ex.dedup();
        if let Some(&bad) = ex.iter().find(|&&r| r >= self.size()) {
            return Err(Error::InvalidArgument(format!(
                "rank {me}: shrink: rank {bad} is not a rank of this communicator of {} ranks",
                self.size()
            )));
        }
        if ex.contains(&me) {
            return Err(Error::InvalidArgument(format!(
                "rank {me}: shrink: this rank is in the exclude list (excluded ranks do not call \
                 shrink)"
            )));
        }
        let survivors: Vec<Rank> = (0..self.size()).filter(|r| !ex.contains(r)).collect();
        let rank = survivors.iter().position(|&r| r == me).unwrap_or(0);
        let n = {
            let mut st = self.inner.lock();
            st.shrinks += 1;
            st.shrinks
        };
        let list: String = if ex.len() <= 16 {
            ex.iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(",")
        } else {
            use sha2::Digest;
            let mut h = sha2::Sha256::new();
            for r in &ex {
                h.update((*r as u64).to_le_bytes());
            }
            h.finalize()[..8]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect()
        };
        let boot = self.inner.boot.child(&format!("shrink{n}/without{list}"));
        setup::init(boot, rank, survivors.len(), self.inner.config.clone())
    }

    /// Runs `plan` over raw memory and waits for it: the one path every blocking collective
    /// takes.
    pub(crate) fn run(
        &self,
        plan: Plan,
        input: (*const u8, usize),
        output: (*mut u8, usize),
    ) -> Result<()> {
        let mut st = self.inner.lock();
        let decision = self.inner.decide(&mut st, &plan);
        self.run_decided(st, plan, decision, input, output)
    }

    /// [`Communicator::run`] on the route `decision`, with the lock `st` held.
    fn run_decided(
        &self,
        mut st: MutexGuard<'_, State>,
        plan: Plan,
        decision: Decision,
        input: (*const u8, usize),
        output: (*mut u8, usize),
    ) -> Result<()> {
        // Nothing queued: an area all-reduce runs right here, without a queue or a result slot.
        if let Route::Area(way) = decision.route
            && !st.engine.busy()
        {
            let seq = st.collectives;
            st.collectives += 1;
            // A call of the one-turn lane is recorded without reading the clock unless it
            // waits or fails.
            let lane = st.engine.lane(&plan, way);
            let mark = if lane {
                self.inner.trace.lane_call(seq, &plan, decision.route)
            } else {
                self.inner
                    .trace
                    .collective(seq, &plan, decision.route, true)
            };
            return match st
                .engine
                .run_area_now((plan, way, seq), lane, input, output)
            {
                Ok(true) => {
                    self.inner.trace.done_untimed(mark);
                    Ok(())
                }
                r => {
                    let r = r.map(drop);
                    self.inner.trace.end(mark, &r);
                    r
                }
            };
        }
        let result = Arc::new(OpResult::default());
        self.inner
            .submit(&mut st, plan, decision, input, output, result.clone())?;
        // Not holding the lock throughout: the operation may be queued behind started sends
        // and receives that wait for another thread's next one.
        drop(st);
        self.inner.wait(&result);
        result.take().unwrap_or(Ok(()))
    }

    /// Queues `plan` for the background thread and returns its result slot.
    pub(crate) fn start(
        &self,
        plan: Plan,
        input: (*const u8, usize),
        output: (*mut u8, usize),
    ) -> Result<Arc<OpResult>> {
        let result = Arc::new(OpResult::default());
        {
            let mut st = self.inner.lock();
            let decision = self.inner.decide(&mut st, &plan);
            self.inner
                .submit(&mut st, plan, decision, input, output, result.clone())?;
        }
        self.inner.kick();
        Ok(result)
    }
}

impl Inner {
    /// The communicator's lock; a thread that has to wait for it asks the progress thread to
    /// let go ([`Flags::want`]).
    fn lock(&self) -> MutexGuard<'_, State> {
        match self.state.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                self.flags.want();
                let g = self.state.lock().unwrap_or_else(|p| p.into_inner());
                self.flags.got();
                g
            }
        }
    }

    /// The routing decision for `plan`, logging the priced candidates once per collective,
    /// size class and placement when `oxccl::tune` logs at debug level. A repeated call finds
    /// its decision by one word (the key) in [`State::decided`].
    #[inline]
    fn decide(&self, st: &mut State, plan: &Plan) -> Decision {
        let bytes = plan.count.saturating_mul(plan.dtype.size());
        let key = decided_key(plan, bytes);
        let slot =
            (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - DECIDED.trailing_zeros())) as usize;
        if let Some((k, d)) = &st.decided[slot]
            && *k == key
        {
            return d.clone();
        }
        self.decide_anew(st, plan, (bytes, key, slot))
    }

    /// [`Inner::decide`] where no decision is cached: prices, caches (in `slot` under `key`,
    /// unless the size is too large for a key) and logs.
    #[inline(never)]
    fn decide_anew(
        &self,
        st: &mut State,
        plan: &Plan,
        (bytes, key, slot): (usize, u64, usize),
    ) -> Decision {
        let st = &mut *st;
        let d = tune::decide(
            plan,
            &self.means,
            &self.config,
            &st.costs,
            &self.hosts,
            &mut st.prices,
        );
        if key != u64::MAX {
            st.decided[slot] = Some((key, d.clone()));
        }
        if tracing::enabled!(target: "oxccl::tune", tracing::Level::DEBUG) {
            let class = usize::BITS - bytes.leading_zeros();
            if st.logged.len() < 4096
                && st
                    .logged
                    .insert((plan.collective, class, (plan.in_place, plan.on_device)))
            {
                let table = self.price(st, plan);
                tracing::debug!(target: "oxccl::tune", rank = self.rank,
                    "{} of {bytes} B{}{}: {}; candidates: {} (costs: {})",
                    plan.collective,
                    if plan.in_place { " in place" } else { "" },
                    if plan.on_device { " on device memory" } else { "" },
                    d,
                    tune::table_line(plan.collective, &table),
                    st.costs.source());
            }
        }
        d
    }

    /// Every route the tuner prices for `plan`, with its estimate (see `tune::price`).
    fn price(&self, st: &mut State, plan: &Plan) -> Vec<(Route, Option<f64>)> {
        tune::price(
            plan,
            &self.means,
            &self.config,
            &st.costs,
            &self.hosts,
            &mut st.prices,
        )
    }

    /// Queues `plan` on the route `decision` (the routing decision's for it): schedules are
    /// planned once and cached.
    #[allow(clippy::too_many_arguments)]
    fn submit(
        &self,
        st: &mut State,
        plan: Plan,
        decision: Decision,
        input: (*const u8, usize),
        output: (*mut u8, usize),
        result: Arc<OpResult>,
    ) -> Result<()> {
        let seq = st.collectives;
        let work = match decision.route {
            Route::Area(way) => Work::Area { plan, way, seq },
            Route::Schedule(choice) => {
                let schedule = self.schedule(st, plan, choice, decision.why)?;
                let descriptor =
                    Descriptor::collective(seq, &plan, choice.algorithm, choice.slice_bytes);
                Work::Schedule {
                    schedule,
                    descriptor,
                    dtype: plan.dtype,
                }
            }
            Route::Device(_) => {
                return Err(Error::InvalidArgument(format!(
                    "rank {}: {} on device memory reached the host engine",
                    self.rank, plan.collective
                )));
            }
        };
        st.collectives += 1;
        let mark = self.trace.collective(seq, &plan, decision.route, false);
        st.engine.submit(Operation {
            name: OpName::Collective(plan.collective, seq),
            work,
            input,
            output,
            result,
            mark,
        });
        Ok(())
    }

    /// This rank's schedule of `plan` with `choice`, planned once and then cached.
    fn schedule(
        &self,
        st: &mut State,
        plan: Plan,
        choice: Choice,
        why: &str,
    ) -> Result<Arc<Compiled>> {
        let key = (plan, choice);
        if let Some(s) = st.cache.get(&key) {
            return Ok(s.clone());
        }
        let s = algo::schedule_on(&plan, &choice, self.rank, &self.hosts).map_err(|e| {
            Error::InvalidArgument(format!("rank {}: {}: {e}", self.rank, plan.collective))
        })?;
        tracing::debug!(rank = self.rank, collective = %plan.collective, count = plan.count,
            algorithm = %choice.algorithm, steps = s.len(), "planned: {why}");
        if st.cache.len() >= CACHE_ENTRIES {
            st.cache.clear();
        }
        let s = Arc::new(Compiled::new(s));
        st.cache.insert(key, s.clone());
        Ok(s)
    }

    /// Wakes (starting it if needed) the thread that drives asynchronous operations.
    pub(crate) fn kick(self: &Arc<Self>) {
        if !self.background.started.swap(true, Ordering::AcqRel) {
            let weak: Weak<Inner> = Arc::downgrade(self);
            let spawned = std::thread::Builder::new()
                .name(format!("oxccl-progress-{}", self.rank))
                .spawn(move || progress_thread(weak));
            if spawned.is_err() {
                // Without the thread, work is driven by whoever waits for it.
                self.background.started.store(false, Ordering::Release);
            }
        }
        *self
            .background
            .wake
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = true;
        self.background.cv.notify_one();
    }

    /// Helps progress without blocking (for `is_completed`): one pass if nobody else is driving.
    pub(crate) fn poke(&self) {
        if let Ok(mut st) = self.state.try_lock() {
            st.engine.drive_for(Duration::ZERO);
        }
    }

    /// Waits for `result`, driving progress whenever nobody else is.
    /// A thread that waits for the lock (to queue an operation, which `result`'s may need)
    /// gets it: the driver lets go and lets it in first.
    pub(crate) fn wait(&self, result: &OpResult) {
        // The operation may hold the caller's memory (blocking calls lend it by address), and
        // a panic unwinding out of this wait would return while the engine, the progress
        // thread or a peer may still write it. Nothing in the engine panics by design; if
        // something does (a bug, or a `tracing` subscriber that panics on one of our events),
        // the process aborts instead of letting that happen.
        struct Unwinding<'a>(&'a OpResult);
        impl Drop for Unwinding<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() && !self.0.is_done() {
                    eprintln!(
                        "oxccl: a panic inside a call whose operation still holds the caller's \
                         memory; aborting the process (unwinding would let that memory go while \
                         the operation or a peer may still write it)"
                    );
                    std::process::abort();
                }
            }
        }
        let _unwinding = Unwinding(result);
        while !result.is_done() {
            match self.state.try_lock() {
                Ok(mut st) => st.engine.drive_until(result),
                Err(std::sync::TryLockError::Poisoned(p)) => {
                    p.into_inner().engine.drive_until(result)
                }
                Err(std::sync::TryLockError::WouldBlock) => {
                    result.wait_for(Duration::from_millis(1));
                    continue;
                }
            }
            self.let_in(|| result.is_done());
        }
    }

    /// After letting go of the lock: yields (a while, at most) to threads waiting for it,
    /// until none is left or `stop` says to go on.
    fn let_in(&self, stop: impl Fn() -> bool) {
        for _ in 0..1000 {
            if stop() || !self.flags.wanted() {
                break;
            }
            std::thread::yield_now();
        }
    }
}

fn progress_thread(weak: Weak<Inner>) {
    loop {
        let Some(inner) = weak.upgrade() else { return };
        if inner.background.stop.load(Ordering::Acquire) {
            return;
        }
        {
            let wake = inner
                .background
                .wake
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let (mut wake, _) = inner
                .background
                .cv
                .wait_timeout_while(wake, Duration::from_millis(100), |w| !*w)
                .unwrap_or_else(|p| p.into_inner());
            *wake = false;
        }
        loop {
            let mut st = inner.state.lock().unwrap_or_else(|p| p.into_inner());
            if !st.engine.busy() {
                break;
            }
            st.engine.drive_for(Duration::from_millis(5));
            drop(st);
            std::thread::yield_now();
            // A thread that queues an operation gets the lock before this one takes it back.
            inner.let_in(|| false);
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.background.stop.store(true, Ordering::Release);
        self.background.cv.notify_all();
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        st.engine.shutdown("the communicator was dropped");
        self.boot.let_go(self.size, self.config.timeout);
    }
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank())
            .field("size", &self.size())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::decided_key;
    use crate::algo::{Collective, Plan};
    use crate::types::{DataType, ReduceOp};

    /// A cached decision is found only by a call that could not be priced differently: every
    /// input of the pricing is in the key (the type and operator were not, so a call of one
    /// type took the decision cached for another of the same size).
    #[test]
    fn a_decision_is_cached_per_type_operator_and_placement() {
        let p = Plan::new(Collective::AllReduce, 1024, DataType::F32);
        let keys = [
            decided_key(&p, 4096),
            decided_key(&Plan::new(Collective::AllReduce, 1024, DataType::I32), 4096),
            decided_key(&Plan::new(Collective::AllReduce, 2048, DataType::F16), 4096),
            decided_key(&p.op(ReduceOp::Max), 4096),
            decided_key(&p.in_place(true), 4096),
            decided_key(&p.on_device(true), 4096),
            decided_key(
                &Plan::new(Collective::ReduceScatter, 1024, DataType::F32),
                4096,
            ),
            decided_key(&p, 4100),
        ];
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a, b, "{keys:x?}");
            }
        }
        assert_eq!(decided_key(&p, 1 << 44), u64::MAX);
        assert_ne!(decided_key(&p, (1 << 44) - 1), u64::MAX);
    }
}
