//! Where a call's work goes, decided in one place:
//!
//! - a blocking communicator outside a group: the operation runs now, and the call returns when
//!   this rank's part is done (the same path as the Rust API's methods);
//! - a non-blocking communicator (`oxcclConfig_t.blocking = 0`): the operation starts on the
//!   communicator's progress thread and the call returns `oxcclInProgress`;
//!   `oxcclCommGetAsyncError` says when it is done, and until then the buffers are oxccl's;
//! - inside `oxcclGroupStart`/`oxcclGroupEnd` (nested; per thread, as in NCCL): operations and
//!   communicator creations are kept, and the outermost `oxcclGroupEnd` creates the
//!   communicators (concurrently), then starts every kept operation on every communicator
//!   before it waits for any. So one thread can drive several ranks of one job (the
//!   communicators of `oxcclCommInitAll`), and paired sends and receives cannot deadlock: a
//!   communicator's sends and receives of one group go as one batch.
//!
//! If a call the group keeps (a collective, a send or receive, a communicator's creation) fails
//! inside it, `oxcclGroupEnd` runs none of the group's work and returns that failure; other
//! calls that fail inside a group (queries, registration) fail alone, as in NCCL.

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use oxccl_core::algo::{Collective, Plan};
use oxccl_core::{Communicator, RawMessage, ReduceOp};

use crate::abi::*;
use crate::boundary::{Failure, Outcome, guard};
use crate::entry::{Entry, InFlight};
use crate::handles;
use crate::ops::scale;

/// An operation of a call, on the caller's memory.
pub(crate) enum Job {
    /// A collective: its plan and regions as [`Communicator::run_raw`] takes them, and the
    /// scalar of a pre-multiplied sum (then `plan.op` is `Sum`).
    Collective {
        plan: Plan,
        input: (*const u8, usize),
        output: (*mut u8, usize),
        premul: Option<[u8; 8]>,
    },
    /// A send or a receive.
    Message(RawMessage),
}

/// A communicator to create: where its handle goes, whether it blocks, and how to make it.
pub(crate) struct Creation {
    pub(crate) out: *mut oxcclComm_t,
    pub(crate) blocking: bool,
    /// Makes the communicator; `None` for a rank that joins none (a split's NOCOLOR).
    pub(crate) make: Box<dyn FnOnce() -> Result<Option<Communicator>, Failure> + Send>,
}

/// What this thread's open group keeps (its depth is `DEPTH`).
#[derive(Default)]
struct Group {
    jobs: Vec<(Arc<Entry>, Job)>,
    creations: Vec<Creation>,
    /// The first failure of a call inside the group.
    error: Option<Failure>,
    /// Host copies of device memory that kept jobs use (see `device`).
    held: Vec<crate::device::Held>,
}

/// Groups nested deeper than this are a caller's bug (a missing `oxcclGroupEnd` in a loop).
const MAX_DEPTH: usize = 1 << 16;

thread_local! {
    static GROUP: RefCell<Group> = RefCell::new(Group::default());
    /// How deeply this thread's groups are nested (0: no group); a const-initialized cell, cheap
    /// for the check every call makes.
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// Whether this thread has a group open.
#[inline]
pub(crate) fn in_group() -> bool {
    DEPTH.try_with(Cell::get).unwrap_or(0) > 0
}

/// Remembers `f`, the failure of a call inside this thread's group, for `oxcclGroupEnd`.
pub(crate) fn note_failure(f: &Failure) {
    let _ = GROUP.try_with(|g| {
        if in_group()
            && let Ok(mut g) = g.try_borrow_mut()
        {
            g.error.get_or_insert_with(|| f.clone());
        }
    });
}

/// `entry`'s handle was just destroyed or aborted (`how`): if this thread's open group kept
/// operations on it, the group fails and runs none of its work at `oxcclGroupEnd` (they would
/// write the caller's buffers after the destroy returned).
pub(crate) fn dropped_in_group(entry: &Arc<Entry>, how: &str) {
    let _ = GROUP.try_with(|g| {
        if !in_group() {
            return;
        }
        let Ok(mut g) = g.try_borrow_mut() else {
            return;
        };
        if g.jobs.iter().any(|(e, _)| Arc::ptr_eq(e, entry)) {
            let rank = entry.comm().map(|c| c.rank()).ok();
            let who = rank.map_or(String::new(), |r| format!("rank {r}: "));
            g.error.get_or_insert_with(|| {
                Failure::usage(format!(
                    "{who}comm was {how} inside the group, before oxcclGroupEnd, with \
                     operations the group kept for it"
                ))
            });
        }
    });
}

/// Keeps `held` for this thread's open group until its outermost `oxcclGroupEnd`.
pub(crate) fn hold(held: crate::device::Held) {
    GROUP.with(|g| g.borrow_mut().held.push(held));
}

/// Keeps `item` for this thread's group if one is open; gives it back otherwise.
fn keep<T>(item: T, put: impl FnOnce(&mut Group, T)) -> Option<T> {
    GROUP.with(|g| {
        if in_group() {
            put(&mut g.borrow_mut(), item);
            None
        } else {
            Some(item)
        }
    })
}

/// Runs, starts or keeps `job` on `entry`'s communicator (see the module documentation).
#[inline]
pub(crate) fn issue(entry: &Arc<Entry>, job: Job) -> Outcome {
    let comm = entry.for_operation()?;
    if entry.blocking && !in_group() {
        // The common case, first: run_raw checks the regions itself.
        let r = run_now(comm, job);
        if let Err(f) = &r {
            entry.fail(f);
        }
        return r;
    }
    if let Job::Collective {
        plan,
        input,
        output,
        ..
    } = &job
    {
        comm.check_raw(plan, *input, *output)?;
    }
    let Some(job) = keep(job, |g, job| g.jobs.push((entry.clone(), job))) else {
        return Ok(());
    };
    let op = match job {
        Job::Collective {
            plan,
            input,
            output,
            premul,
        } => start(comm, plan, input, output, premul)?,
        Job::Message(m) => start_messages(comm, &[m])?,
    };
    entry.push(op);
    Err(Failure::in_progress())
}

/// Creates a communicator now (blocking), in the background (non-blocking: the handle is
/// written at once and the call returns `oxcclInProgress`), or at `oxcclGroupEnd`.
///
/// # Safety
///
/// `creation.out` is writable (checked not NULL by the caller), until `oxcclGroupEnd` inside
/// a group.
pub(crate) unsafe fn create(creation: Creation) -> Outcome {
    let Some(c) = keep(creation, |g, c| g.creations.push(c)) else {
        return Ok(());
    };
    if c.blocking {
        let handle = match (c.make)()? {
            Some(comm) => handles::register(Arc::new(Entry::ready(comm, true))),
            None => std::ptr::null_mut(),
        };
        // SAFETY: the caller's contract.
        unsafe { c.out.write(handle) };
        return Ok(());
    }
    let entry = Arc::new(Entry::creating(false));
    let handle = handles::register(entry.clone());
    let make = c.make;
    let spawned = std::thread::Builder::new()
        .name("oxccl-create".into())
        .spawn(move || {
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(make))
                .unwrap_or_else(|_| {
                    Err(Failure {
                        code: oxcclInternalError,
                        message: "internal error (a bug in oxccl, please report it): a panic \
                                  while creating the communicator"
                            .into(),
                    })
                });
            entry.created(outcome);
        });
    if let Err(e) = spawned {
        let _ = handles::remove(handle, "comm");
        return Err(Failure {
            code: oxcclSystemError,
            message: format!("could not start a thread to create the communicator: {e}"),
        });
    }
    // SAFETY: the caller's contract.
    unsafe { c.out.write(handle) };
    Err(Failure::in_progress())
}

/// A pre-multiplied sum made into a sum: plan, input, output, and the memory the input is.
type Scaled = (Plan, (*const u8, usize), (*mut u8, usize), Vec<u8>);

/// The regions and plan of a pre-multiplied sum: the input scaled by `k` into new memory,
/// summed out of place into the output.
fn premultiplied(
    comm: &Communicator,
    plan: Plan,
    input: (*const u8, usize),
    output: (*mut u8, usize),
    k: [u8; 8],
) -> Result<Scaled, Failure> {
    let (me, n) = (comm.rank(), comm.size());
    let size = plan.dtype.size();
    let in_len = plan.input_count(me, n) * size;
    let out_len = plan.output_count(me, n) * size;
    let mut scratch = vec![0u8; in_len];
    if in_len > 0 {
        // SAFETY: check_raw accepted the regions, and the caller's contract makes the input
        // (in place: the whole buffer, whose first `in_len` bytes are the input) readable.
        let src = unsafe { std::slice::from_raw_parts(input.0, in_len) };
        scale(&mut scratch, src, plan.dtype, k)?;
    }
    let output = if plan.in_place && plan.collective == Collective::ReduceScatter {
        // In place, this rank's block of the buffer is the output.
        // SAFETY: the block lies inside the buffer (check_raw: its length is n blocks).
        (unsafe { output.0.add(me * out_len) }, out_len)
    } else {
        (output.0, out_len)
    };
    let plan = plan.op(ReduceOp::Sum).in_place(false);
    Ok((plan, (scratch.as_ptr(), scratch.len()), output, scratch))
}

/// Runs `job` and returns when it is done.
#[inline]
fn run_now(comm: &Communicator, job: Job) -> Outcome {
    match job {
        Job::Collective {
            plan,
            input,
            output,
            premul: None,
        } => {
            // SAFETY: the collectives' buffer contract (oxccl.h) for the call that is running;
            // check_raw accepted the regions.
            Ok(unsafe { comm.run_raw(plan, input, output) }?)
        }
        Job::Collective {
            plan,
            input,
            output,
            premul: Some(k),
        } => {
            let (plan, input, output, _scratch) = premultiplied(comm, plan, input, output, k)?;
            // SAFETY: as above; the input is `_scratch`, alive until this returns.
            Ok(unsafe { comm.run_raw(plan, input, output) }?)
        }
        Job::Message(m) => Ok(start_messages(comm, &[m])?.pending.wait()?),
    }
}

/// Starts a collective.
fn start(
    comm: &Communicator,
    plan: Plan,
    input: (*const u8, usize),
    output: (*mut u8, usize),
    premul: Option<[u8; 8]>,
) -> Result<InFlight, Failure> {
    let (plan, input, output, scratch) = match premul {
        Some(k) => {
            let (p, i, o, s) = premultiplied(comm, plan, input, output, k)?;
            (p, i, o, Some(s))
        }
        None => (plan, input, output, None),
    };
    // SAFETY: the collectives' buffer contract (oxccl.h): the memory is oxccl's until the
    // operation is seen complete; the scratch lives in the InFlight, dropped after the
    // Pending (which waits).
    let pending = unsafe { comm.start_raw(plan, input, output) }?;
    Ok(InFlight {
        pending,
        _scratch: scratch,
    })
}

/// Starts sends and receives as one batch.
fn start_messages(comm: &Communicator, messages: &[RawMessage]) -> Result<InFlight, Failure> {
    // SAFETY: the buffer contract of oxcclSend/oxcclRecv (oxccl.h): the memory is oxccl's
    // until the operation is seen complete.
    let pending = unsafe { comm.start_point_to_point_raw(messages) }?;
    Ok(InFlight {
        pending,
        _scratch: None,
    })
}

/// Starts a group: calls on this thread are kept until the matching `oxcclGroupEnd`. Groups
/// nest; only the outermost end runs them.
#[unsafe(no_mangle)]
pub extern "C" fn oxcclGroupStart() -> oxcclResult_t {
    guard("oxcclGroupStart", || {
        let depth = DEPTH.get();
        if depth >= MAX_DEPTH {
            return Err(Failure::usage(format!(
                "groups nested {MAX_DEPTH} deep: an oxcclGroupEnd is missing"
            )));
        }
        DEPTH.set(depth + 1);
        Ok(())
    })
}

/// Ends a group. The outermost end creates the group's communicators, then starts every
/// operation of the group and, for blocking communicators, waits for them all; with a
/// non-blocking communicator among them it returns `oxcclInProgress` (see
/// `oxcclCommGetAsyncError`). Returns the first failure, or that of a call the group kept (a
/// collective, send, receive or creation; then nothing ran).
#[unsafe(no_mangle)]
pub extern "C" fn oxcclGroupEnd() -> oxcclResult_t {
    guard("oxcclGroupEnd", || {
        let depth = DEPTH.get();
        if depth == 0 {
            return Err(Failure::usage("oxcclGroupEnd without oxcclGroupStart"));
        }
        DEPTH.set(depth - 1);
        if depth > 1 {
            return Ok(());
        }
        let Group {
            jobs,
            creations,
            error,
            held,
        } = GROUP.with(|g| std::mem::take(&mut *g.borrow_mut()));
        if let Some(e) = error {
            // Device collectives the ranks already deposited run whatever happens (other ranks'
            // kernels may be enqueued on this rank's buffers): completed in their context.
            let deposited = crate::device::complete_native(held);
            return Err(Failure {
                code: e.code,
                message: format!(
                    "a call inside the group failed, so {} of the group's work ran: {}",
                    if deposited {
                        "none but its device collectives"
                    } else {
                        "none"
                    },
                    e.message
                ),
            });
        }
        let created = create_all(creations);
        let ran = launch(jobs);
        // The jobs of blocking communicators are done (only they take device memory): their
        // results go to the device, unless the group failed.
        let back = if ran.as_ref().err().is_none_or(|f| f.code == oxcclInProgress) {
            crate::device::put_back(held)
        } else {
            crate::device::complete_native(held);
            Ok(())
        };
        created.and(back).and(ran)
    })
}

/// Creates the communicators of a group, each on its own thread (the ranks of one job created
/// from one thread must meet), and writes their handles.
fn create_all(creations: Vec<Creation>) -> Outcome {
    if creations.is_empty() {
        return Ok(());
    }
    let (outs, makes): (Vec<_>, Vec<_>) = creations
        .into_iter()
        .map(|c| ((c.out, c.blocking), c.make))
        .unzip();
    let results: Vec<Result<Option<Communicator>, Failure>> = std::thread::scope(|s| {
        let threads: Vec<_> = makes.into_iter().map(|make| s.spawn(make)).collect();
        threads
            .into_iter()
            .map(|t| {
                t.join().unwrap_or_else(|_| {
                    Err(Failure {
                        code: oxcclInternalError,
                        message: "internal error (a bug in oxccl, please report it): a panic \
                                  while creating a communicator"
                            .into(),
                    })
                })
            })
            .collect()
    });
    let mut first = Ok(());
    for ((out, blocking), r) in outs.into_iter().zip(results) {
        match r {
            Ok(made) => {
                let handle = match made {
                    Some(comm) => handles::register(Arc::new(Entry::ready(comm, blocking))),
                    None => std::ptr::null_mut(),
                };
                // SAFETY: the creating call checked `out` and the caller keeps it writable
                // until oxcclGroupEnd.
                unsafe { out.write(handle) };
            }
            Err(f) => {
                if first.is_ok() {
                    first = Err(f);
                }
            }
        }
    }
    first
}

/// Starts the kept operations, every communicator's before waiting for any, then waits for
/// those of blocking communicators.
fn launch(jobs: Vec<(Arc<Entry>, Job)>) -> Outcome {
    // Per communicator, in order of first appearance: its collectives, then its messages.
    let mut per: Vec<(Arc<Entry>, Vec<Job>, Vec<RawMessage>)> = Vec::new();
    for (entry, job) in jobs {
        let i = match per.iter().position(|p| Arc::ptr_eq(&p.0, &entry)) {
            Some(i) => i,
            None => {
                per.push((entry, Vec::new(), Vec::new()));
                per.len() - 1
            }
        };
        match job {
            Job::Message(m) => per[i].2.push(m),
            other => per[i].1.push(other),
        }
    }
    let mut first: Option<Failure> = None;
    let mut flights: Vec<(Arc<Entry>, InFlight)> = Vec::new();
    for (entry, collectives, messages) in per {
        // Another thread may have destroyed the handle since the group kept its operations
        // (this thread's own destroy already failed the group: `dropped_in_group`).
        let comm = match entry.for_operation().and_then(|c| {
            if entry.registered_now() {
                Ok(c)
            } else {
                Err(Failure::usage(format!(
                    "rank {}: comm was destroyed (or aborted) before oxcclGroupEnd started the \
                     operations the group kept for it",
                    c.rank()
                )))
            }
        }) {
            Ok(c) => c,
            Err(f) => {
                first.get_or_insert(f);
                continue;
            }
        };
        for job in collectives {
            let Job::Collective {
                plan,
                input,
                output,
                premul,
            } = job
            else {
                continue;
            };
            match start(comm, plan, input, output, premul) {
                Ok(op) => flights.push((entry.clone(), op)),
                Err(f) => {
                    entry.fail(&f);
                    first.get_or_insert(f);
                }
            }
        }
        if !messages.is_empty() {
            match start_messages(comm, &messages) {
                Ok(op) => flights.push((entry.clone(), op)),
                Err(f) => {
                    entry.fail(&f);
                    first.get_or_insert(f);
                }
            }
        }
    }
    let mut in_progress = false;
    for (entry, op) in flights {
        if entry.blocking {
            if let Err(e) = op.pending.wait() {
                let f = Failure::from(e);
                entry.fail(&f);
                first.get_or_insert(f);
            }
        } else {
            entry.push(op);
            in_progress = true;
        }
    }
    match first {
        Some(f) => Err(f),
        None if in_progress => Err(Failure::in_progress()),
        None => Ok(()),
    }
}
