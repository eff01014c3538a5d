//! Collectives on device memory between ranks that share one GPU inside one process (threads of
//! [`Communicator::init_local`], or of a program that makes one communicator per thread): the
//! reductions and copies run on the device, in `kernels/reduce.cu`'s `oxccl_reduce_multi`,
//! straight between the ranks' buffers, and the call returns as soon as the work is enqueued.
//!
//! # How a call runs
//!
//! The ranks of such a communicator share one [`DeviceGroup`] (a process-wide registry finds it
//! by the communicator's identity). Each rank *deposits* its part of a call: it records an event
//! on its stream (the point after everything the stream already holds) and leaves its buffers'
//! addresses, its call and that event in the group. The rank whose deposit completes the call
//! checks that every rank made the same call, makes the group's own stream wait for every
//! rank's event, enqueues the kernels there (each element of every input read once, each
//! element of every output written once: all-reduce is one launch, all-gather and
//! reduce-scatter one per rank, all-to-all one per pair), records the group's *done* event after
//! them, and wakes the others. Each rank then makes its stream wait for the done event and
//! returns: its stream's later work sees the result, and nothing on the host waited for the
//! device. Every step on the host is a lock and a condition variable; no host thread ever waits
//! for the GPU. Inside a C ABI group a rank deposits each call when it is made and completes
//! them at the group's end, so one thread can drive every rank, and a rank may have several
//! calls waiting: they are decided in order, the k-th of every rank together.
//!
//! # Why it is sound
//!
//! A rank's buffers are touched only by kernels enqueued after its event and before the done
//! event its own stream waits for, so the stream orders them as its own work (cudarc's buffers
//! order their later uses, a free included, after the stream). The events are reused from call
//! to call: a wait enqueued on an event waits for its latest record, so a decision that sees a
//! rank's event recorded again (by its next deposit) or a rank that sees the done event
//! recorded again (by a later decision) waits for a later point of the same stream, which is
//! never behind the work it orders, and never waits on work not yet enqueued (a rank's stream
//! waits on the done event only after its call was decided). A rank that gives up (deadline,
//! abort) withdraws its deposits under the group's lock, so no kernel is ever enqueued on its
//! buffers after it returned; once the kernels are enqueued, every rank's outcome is to wait
//! for them.
//!
//! # When it does not apply
//!
//! The routing decision says which calls run here (`tune`'s `Route::Device`, from what every rank
//! knows: [`Communicator::explain`] of the plan with `on_device`); [`Communicator::device_deposit`]
//! asks it.
//! Ranks in several processes (CUDA IPC is not built yet), more than [`MULTI_MAX`] ranks, a
//! pre-multiplied sum, gather, scatter and in-place all-to-all: the caller stages through host
//! memory as before, decided the same way on every rank (from what every rank knows, or by the
//! completing rank: ranks whose streams belong to different CUDA contexts, or a context that is
//! not the device's primary one, which the group's kernels run in).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use cudarc::driver::sys::{self, CUevent, CUstream};

use crate::algo::{Collective, Plan};
use crate::error::{Error, Result};
use crate::exec::flags::Flags;
use crate::reduce::cuda::{CudaReducer, MULTI_MAX};
use crate::tune::{DeviceWay, Route};
use crate::types::{DataType, Rank, ReduceOp};

use super::Communicator;

/// The ranks of one communicator inside this process, and the call they are assembling.
pub(crate) struct DeviceGroup {
    size: usize,
    state: Mutex<State>,
    changed: Condvar,
    /// `State::decided`, readable without the lock: waiters look at it for a while before they
    /// sleep (a thread woken through the condition variable costs tens of microseconds).
    decided: AtomicU64,
}

/// How long a rank looks for its call's outcome before it sleeps on the condition variable.
const SPIN: Duration = Duration::from_micros(150);

/// A CUDA event of the group's context (destroyed with the group).
struct Event(CUevent);

// SAFETY: a CUevent handle may be used from any thread of the process; the group's lock orders
// every use.
unsafe impl Send for Event {}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: the event was created by cuEventCreate and is destroyed once; the driver
        // defers the destruction until work waiting on it is done.
        unsafe {
            let _ = sys::cuEventDestroy_v2(self.0);
        }
    }
}

/// One rank's part of the call being assembled.
#[derive(Clone, Copy, Debug)]
struct Deposit {
    /// The rank's count of native calls (every rank's must agree).
    index: u64,
    plan: Plan,
    /// Device addresses of this rank's input and output (in place: as the plan's table says).
    send: u64,
    recv: u64,
    /// The context of the rank's stream.
    ctx: usize,
    /// The rank's buffers lie in another context than its stream's: the call is staged for
    /// every rank (its kernels would meet an illegal address, which loses the whole context).
    foreign: bool,
}

// Fields drop in order: the events before the reducer, which may hold the last reference to
// their context.
#[derive(Default)]
struct State {
    /// Per rank, its calls not yet decided, oldest first (inside a group a rank may deposit
    /// several before any is decided).
    deposits: Vec<VecDeque<Deposit>>,
    /// Per rank, its native calls so far (every rank's count must agree in a call).
    calls: Vec<u64>,
    /// Per rank, the event it records on its stream at each deposit.
    ready: Vec<Option<Event>>,
    /// Recorded on the group's stream after each call's kernels.
    done: Option<Event>,
    /// The context the group's events and kernels belong to (the first deposit's).
    ctx: Option<usize>,
    /// Calls decided so far: a rank's deposit that was k-th in its queue when it was made is
    /// decision `decided + k` (numbered from 0).
    decided: u64,
    /// Ranks asleep on the condition variable (the decider wakes them only when there are).
    sleepers: usize,
    /// Outcomes not yet taken by every rank: decision → (outcome, ranks yet to take it).
    verdicts: HashMap<u64, (Verdict, usize)>,
    /// The kernels, on the group's stream (made at the first launch).
    reducer: Option<Arc<CudaReducer>>,
}

#[derive(Clone, Debug)]
enum Verdict {
    /// The kernels are enqueued; wait for the done event.
    Launched,
    /// Stage through host memory instead (why).
    Staged(String),
    /// The ranks' calls differ: every rank's, described.
    Mismatch(Vec<String>),
    /// A CUDA call failed.
    Failed(String),
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The groups of this process by communicator identity.
fn registry() -> &'static Mutex<HashMap<Vec<u8>, Weak<DeviceGroup>>> {
    static GROUPS: OnceLock<Mutex<HashMap<Vec<u8>, Weak<DeviceGroup>>>> = OnceLock::new();
    GROUPS.get_or_init(Mutex::default)
}

impl DeviceGroup {
    /// The group of the communicator identified by `key` (the same on all its ranks, different
    /// for every other communicator), made by the first of its ranks to ask.
    pub(crate) fn join(key: Vec<u8>, size: usize) -> Option<Arc<DeviceGroup>> {
        if !(2..=MULTI_MAX).contains(&size) {
            return None;
        }
        let mut groups = registry().lock().unwrap_or_else(|e| e.into_inner());
        groups.retain(|_, g| g.strong_count() > 0);
        if let Some(g) = groups.get(&key).and_then(Weak::upgrade) {
            return (g.size == size).then_some(g);
        }
        let g = Arc::new(DeviceGroup {
            size,
            state: Mutex::new(State {
                deposits: vec![VecDeque::new(); size],
                calls: vec![0; size],
                ready: (0..size).map(|_| None).collect(),
                ..State::default()
            }),
            changed: Condvar::new(),
            decided: AtomicU64::new(0),
        });
        groups.insert(key, Arc::downgrade(&g));
        Some(g)
    }
}

/// A call deposited in the group and not yet completed: [`NativeCall::complete`] waits for its
/// outcome (dropping it does too, so that no rank returns while kernels may yet be enqueued on
/// its buffers).
pub struct NativeCall {
    group: Arc<DeviceGroup>,
    flags: Arc<Flags>,
    rank: Rank,
    /// The decision this call waits for.
    decision: u64,
    /// This rank's count of native calls at this one.
    index: u64,
    stream: usize,
    deadline: Instant,
    timeout: Duration,
    what: String,
    completed: bool,
}

impl Communicator {
    /// Whether collectives on device memory between this communicator's ranks can run on the
    /// device without staging (every rank in this process, 2 to [`MULTI_MAX`] of them; see
    /// `comm/native.rs`). Each call still stages when the ranks' streams are not all of the
    /// device's primary context.
    pub fn device_native(&self) -> bool {
        self.inner.native.is_some()
    }

    /// Deposits this rank's part of `plan` on device memory: `send` and `recv` are device
    /// addresses (in place: the one buffer, both times), ordered on `stream`. `None` when the
    /// call does not run natively (see the module documentation): stage it instead. The
    /// plan's sizes, operator and root must have been checked.
    ///
    /// # Safety
    ///
    /// `stream` is a live stream of the context current on this thread; `send` and `recv` are
    /// device memory of that context holding the plan's input and output (as
    /// [`Collective`]'s table says), valid until `stream` has run the work the call enqueues;
    /// the returned call is completed (or dropped) before the buffers are used otherwise.
    pub unsafe fn device_deposit(
        &self,
        plan: Plan,
        send: u64,
        recv: u64,
        stream: CUstream,
    ) -> Result<Option<NativeCall>> {
        let Some(group) = self.inner.native.clone() else {
            return Ok(None);
        };
        let plan = plan.on_device(true);
        // The routing decision, as for every call (`tune::decide` takes this branch for a plan
        // on device memory: it needs neither the costs nor the communicator's lock). Ranks may
        // place a call differently, so it goes to the group where either placement runs on the
        // device, and the group stages it for every rank when any rank's has no device form
        // (`decide`): ranks deciding apart would wait for each other.
        let native = |p: &Plan| {
            crate::tune::on_device(p, &self.inner.means).route == Route::Device(DeviceWay::Native)
        };
        if !native(&plan) && !native(&plan.in_place(!plan.in_place)) {
            return Ok(None);
        }
        let n = self.size();
        let me = self.rank();
        let e = plan.dtype.size() as u64;
        let c = plan.count as u64;
        let (send, recv) = match (plan.in_place, plan.collective) {
            (false, _) => (send, recv),
            (true, Collective::AllGather) => (recv + me as u64 * c * e, recv),
            (true, Collective::ReduceScatter) => (send, send + me as u64 * c * e),
            (true, _) => (recv, recv),
        };
        let what = format!("{} on device memory", plan.collective);
        let fail = |call: &str, r: sys::CUresult| {
            Error::Unavailable(format!("rank {me}: {what}: CUDA: {call} failed: {r:?}"))
        };
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: `ctx` is writable; the driver is loaded (the caller holds a stream).
        let r = unsafe { sys::cuStreamGetCtx(stream, &mut ctx) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(fail("cuStreamGetCtx", r));
        }
        // The buffers' context, where the driver names one (memory of a pool or of the virtual
        // memory calls belongs to none): another than the stream's stages the call for all.
        let foreign = [send, recv].into_iter().filter(|&p| p != 0).any(|p| {
            let mut of: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: `of` is writable and the attribute is written as a CUcontext; any
            // address may be asked about.
            let r = unsafe {
                sys::cuPointerGetAttribute(
                    (&mut of as *mut sys::CUcontext).cast(),
                    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT,
                    p,
                )
            };
            r != sys::CUresult::CUDA_SUCCESS || (!of.is_null() && of != ctx)
        });
        let mut st = lock(&group.state);
        st.calls[me] += 1;
        let index = st.calls[me];
        let ours = *st.ctx.get_or_insert(ctx as usize) == ctx as usize;
        if ours {
            if st.ready[me].is_none() {
                let mut ev: CUevent = std::ptr::null_mut();
                // SAFETY: `ev` is writable; the group's context is current (the stream's).
                let r = unsafe {
                    sys::cuEventCreate(&mut ev, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
                };
                if r != sys::CUresult::CUDA_SUCCESS {
                    return Err(fail("cuEventCreate", r));
                }
                st.ready[me] = Some(Event(ev));
            }
            let ev = st.ready[me].as_ref().map_or(std::ptr::null_mut(), |e| e.0);
            // SAFETY: a live event and stream of the same context. Recording it again is
            // sound while an earlier call still waits to be decided (inside a group): its
            // decision then waits for this later point of the stream, which holds no wait on
            // the group's work that has not been enqueued before it.
            let r = unsafe { sys::cuEventRecord(ev, stream) };
            if r != sys::CUresult::CUDA_SUCCESS {
                return Err(fail("cuEventRecord", r));
            }
        }
        let decision = st.decided + st.deposits[me].len() as u64;
        st.deposits[me].push_back(Deposit {
            index,
            plan,
            send,
            recv,
            ctx: ctx as usize,
            foreign,
        });
        let mut decided_any = false;
        while st.deposits.iter().all(|q| !q.is_empty()) {
            let fronts: Vec<Deposit> = st
                .deposits
                .iter_mut()
                .filter_map(VecDeque::pop_front)
                .collect();
            let verdict = decide(&mut st, &fronts, n);
            let d = st.decided;
            st.verdicts.insert(d, (verdict, n));
            st.decided += 1;
            decided_any = true;
        }
        if decided_any {
            group.decided.store(st.decided, Ordering::Release);
            if st.sleepers > 0 {
                group.changed.notify_all();
            }
        }
        drop(st);
        Ok(Some(NativeCall {
            group,
            flags: self.inner.flags.clone(),
            rank: me,
            decision,
            stream: stream as usize,
            deadline: Instant::now() + self.timeout(),
            timeout: self.timeout(),
            what: format!("{what} (native call {index})"),
            index,
            completed: false,
        }))
    }
}

impl NativeCall {
    /// Waits (at most the communicator's timeout, and not past an abort) until every rank has
    /// deposited, then makes this rank's stream wait for the call's kernels. `Ok(true)`: done
    /// (enqueued); `Ok(false)`: every rank stages this call through host memory instead.
    pub fn complete(mut self) -> Result<bool> {
        self.completed = true;
        self.finish()
    }

    fn finish(&self) -> Result<bool> {
        let me = self.rank;
        let spin_until = Instant::now() + SPIN;
        while self.group.decided.load(Ordering::Acquire) <= self.decision
            && Instant::now() < spin_until
        {
            std::thread::yield_now();
        }
        let mut st = lock(&self.group.state);
        while st.decided <= self.decision {
            if !st.deposits[me].iter().any(|d| d.index == self.index) {
                // An earlier call of this rank gave up and withdrew every later one with it.
                return Err(Error::Aborted {
                    rank: me,
                    op: self.what.clone(),
                    why: "an earlier device call of this rank failed".into(),
                });
            }
            let now = Instant::now();
            let gone = if self.flags.is_aborted() {
                Some(Error::Aborted {
                    rank: me,
                    op: self.what.clone(),
                    why: "abort() was called".into(),
                })
            } else if now >= self.deadline {
                let peer = st.deposits.iter().position(VecDeque::is_empty);
                Some(Error::Timeout {
                    rank: me,
                    op: format!("{} waiting for the other ranks' calls", self.what),
                    peer,
                    after: self.timeout,
                })
            } else {
                None
            };
            if let Some(e) = gone {
                // Not decided, so nothing was enqueued on this rank's buffers, and nothing
                // will be: no call of this rank can complete without its deposits, which go
                // (this one and any later one of a group).
                st.deposits[me].clear();
                return Err(e);
            }
            let wait = (self.deadline - now).min(Duration::from_millis(20));
            st.sleepers += 1;
            st = self
                .group
                .changed
                .wait_timeout(st, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            st.sleepers -= 1;
        }
        let verdict = match st.verdicts.get_mut(&self.decision) {
            Some((v, left)) => {
                let v = v.clone();
                *left -= 1;
                if *left == 0 {
                    st.verdicts.remove(&self.decision);
                }
                Some(v)
            }
            None => None,
        };
        let done = st.done.as_ref().map(|e| e.0);
        drop(st);
        match verdict {
            Some(Verdict::Launched) => {
                let Some(done) = done else {
                    return Err(Error::Unavailable(format!(
                        "rank {me}: {}: the group has no done event",
                        self.what
                    )));
                };
                // SAFETY: a live event of the stream's context; it is recorded again only after
                // every rank (this one included) deposited the next call.
                let r = unsafe { sys::cuStreamWaitEvent(self.stream as CUstream, done, 0) };
                if r != sys::CUresult::CUDA_SUCCESS {
                    return Err(Error::Unavailable(format!(
                        "rank {me}: {}: CUDA: cuStreamWaitEvent failed: {r:?}",
                        self.what
                    )));
                }
                Ok(true)
            }
            Some(Verdict::Staged(why)) => {
                tracing::debug!(
                    rank = me,
                    "{}: staged through host memory: {why}",
                    self.what
                );
                Ok(false)
            }
            Some(Verdict::Mismatch(calls)) => {
                let ours = calls.get(me).cloned().unwrap_or_default();
                let peer = calls.iter().position(|c| *c != ours).unwrap_or(me);
                Err(Error::Mismatch {
                    rank: me,
                    peer,
                    op: self.what.clone(),
                    ours,
                    theirs: calls.get(peer).cloned().unwrap_or_default(),
                })
            }
            Some(Verdict::Failed(why)) => {
                // Part of the call's kernels may be enqueued (a launch failed after others):
                // the done event was recorded after them, so this rank's stream still waits.
                if let Some(done) = done {
                    // SAFETY: as for a launched call.
                    let _ = unsafe { sys::cuStreamWaitEvent(self.stream as CUstream, done, 0) };
                }
                Err(Error::Unavailable(format!(
                    "rank {me}: {}: CUDA: {why}",
                    self.what
                )))
            }
            None => Err(Error::Unavailable(format!(
                "rank {me}: {}: no outcome",
                self.what
            ))),
        }
    }
}

impl Drop for NativeCall {
    fn drop(&mut self) {
        if !self.completed {
            let _ = self.finish();
        }
    }
}

/// Describes a deposit for a mismatch report: what must agree between ranks.
fn describe(d: &Deposit) -> String {
    let p = &d.plan;
    let mut s = format!(
        "call {}: {} of {} {}",
        d.index, p.collective, p.count, p.dtype
    );
    if p.collective.reduces() {
        s += &format!(", {}", p.op);
    }
    if p.collective.rooted() {
        s += &format!(", root {}", p.root);
    }
    s
}

/// Decides the call whose deposits are all in, and enqueues its kernels when it runs here.
fn decide(st: &mut State, deposits: &[Deposit], n: usize) -> Verdict {
    let calls: Vec<String> = deposits.iter().map(describe).collect();
    if calls.iter().any(|c| *c != calls[0]) {
        return Verdict::Mismatch(calls);
    }
    let plan = deposits[0].plan;
    let Some(ctx) = st.ctx else {
        return Verdict::Failed("no context".into());
    };
    if deposits.iter().any(|d| d.ctx != ctx) {
        return Verdict::Staged("the ranks' streams belong to different CUDA contexts".into());
    }
    if deposits.iter().any(|d| d.foreign) {
        return Verdict::Staged(
            "a rank's buffers lie in another CUDA context than its stream".into(),
        );
    }
    if let Some(why) = deposits
        .iter()
        .find_map(|d| crate::tune::device_form(&d.plan).err())
    {
        return Verdict::Staged(why.into());
    }
    if st.reducer.is_none() {
        match group_reducer(ctx) {
            Ok(Some(r)) => st.reducer = Some(r),
            Ok(None) => {
                return Verdict::Staged(
                    "the streams' context is not the device's primary one".into(),
                );
            }
            Err(e) => return Verdict::Failed(e),
        }
    }
    let Some(reducer) = st.reducer.clone() else {
        return Verdict::Failed("no reducer".into());
    };
    if st.done.is_none() {
        let mut ev: CUevent = std::ptr::null_mut();
        // SAFETY: `ev` is writable; the group's context is current on this thread (the
        // depositing rank's stream's).
        let r = unsafe {
            sys::cuEventCreate(&mut ev, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Verdict::Failed(format!("cuEventCreate failed: {r:?}"));
        }
        st.done = Some(Event(ev));
    }
    let own = reducer.stream().cu_stream();
    for ev in st.ready.iter().flatten() {
        // SAFETY: live events and stream of the group's context.
        let r = unsafe { sys::cuStreamWaitEvent(own, ev.0, 0) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Verdict::Failed(format!("cuStreamWaitEvent failed: {r:?}"));
        }
    }
    // SAFETY: every address is device memory of the group's context holding what the plan
    // says (each rank's depositor's promise), ordered after each rank's event and before the
    // done event every rank's stream waits for.
    let launched = unsafe { launch(&reducer, deposits, plan, n) };
    let done = st.done.as_ref().map_or(std::ptr::null_mut(), |e| e.0);
    // SAFETY: a live event and stream of the group's context. Recorded even after a failed
    // launch, so that what was enqueued is still waited for.
    let r = unsafe { sys::cuEventRecord(done, own) };
    match launched {
        Err(e) => Verdict::Failed(e.to_string()),
        Ok(()) if r != sys::CUresult::CUDA_SUCCESS => {
            Verdict::Failed(format!("cuEventRecord failed: {r:?}"))
        }
        Ok(()) => Verdict::Launched,
    }
}

/// A reducer on the device of `ctx`, when `ctx` is that device's primary context (the one the
/// reducer's kernels run in); `None` otherwise.
fn group_reducer(ctx: usize) -> std::result::Result<Option<Arc<CudaReducer>>, String> {
    let mut dev: sys::CUdevice = 0;
    // SAFETY: `dev` is writable; `ctx` is current on this thread.
    let r = unsafe { sys::cuCtxGetDevice(&mut dev) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuCtxGetDevice failed: {r:?}"));
    }
    let reducer = CudaReducer::new(usize::try_from(dev).unwrap_or(0)).map_err(|e| e.to_string())?;
    if reducer.context().cu_ctx() as usize != ctx {
        return Ok(None);
    }
    // The reducer made its context current; the caller's is the same one.
    Ok(Some(Arc::new(reducer)))
}

/// Enqueues the plan's kernels on the reducer's stream.
///
/// # Safety
///
/// As [`CudaReducer::reduce_multi_raw`], for every rank's buffers.
unsafe fn launch(r: &CudaReducer, d: &[Deposit], plan: Plan, n: usize) -> Result<()> {
    let c = plan.count;
    let e = plan.dtype.size();
    let block = (c * e) as u64;
    let by = if plan.op == ReduceOp::Avg && plan.collective.reduces() {
        n
    } else {
        0
    };
    let sends: Vec<u64> = d.iter().map(|d| d.send).collect();
    let recvs: Vec<u64> = d.iter().map(|d| d.recv).collect();
    let (root, op, dtype) = (plan.root, plan.op, plan.dtype);
    let copy = |ins: &[u64], outs: &[u64], bytes: usize| {
        // SAFETY: the caller's promise; bytes need no alignment.
        unsafe { r.reduce_multi_raw(ins, outs, bytes, DataType::U8, ReduceOp::Sum, 0) }
    };
    let reduce = |ins: &[u64], outs: &[u64]| {
        // SAFETY: the caller's promise.
        unsafe { r.reduce_multi_raw(ins, outs, c, dtype, op, by) }
    };
    let at_root = |v: &[u64]| -> Result<[u64; 1]> {
        v.get(root)
            .map(|&p| [p])
            .ok_or_else(|| Error::InvalidArgument(format!("root {root} is not one of {n} ranks")))
    };
    match plan.collective {
        Collective::AllReduce => reduce(&sends, &recvs),
        Collective::Reduce => reduce(&sends, &at_root(&recvs)?),
        Collective::Broadcast => copy(&at_root(&sends)?, &recvs, c * e),
        Collective::AllGather => {
            for (k, &s) in sends.iter().enumerate() {
                let outs: Vec<u64> = recvs.iter().map(|&b| b + k as u64 * block).collect();
                copy(&[s], &outs, c * e)?;
            }
            Ok(())
        }
        Collective::ReduceScatter => {
            for (k, &out) in recvs.iter().enumerate() {
                let ins: Vec<u64> = sends.iter().map(|&b| b + k as u64 * block).collect();
                reduce(&ins, &[out])?;
            }
            Ok(())
        }
        Collective::AllToAll => {
            for (k, &s) in sends.iter().enumerate() {
                for (j, &out) in recvs.iter().enumerate() {
                    copy(&[s + j as u64 * block], &[out + k as u64 * block], c * e)?;
                }
            }
            Ok(())
        }
        other => Err(Error::InvalidArgument(format!(
            "{other} has no device-native form"
        ))),
    }
}
