//! The live communicators, by handle. A handle is an id from a counter, never an address, and
//! is never dereferenced: a call looks its handle up here and works on a shared reference to
//! the communicator's [`Entry`], so a NULL, destroyed or foreign handle is an error rather than
//! a wild read, and a handle is never reused (a stale one cannot reach a newer communicator).
//!
//! Lookups go through a small per-thread cache of the handles this thread used lately (weak
//! references, so a destroyed communicator is not kept alive): the global table's lock is
//! then not taken on every call, and ranks driven by threads of one process do not contend for
//! it. A cached entry counts only while it is still registered (`Entry::registered_now`);
//! anything else goes to the table.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use crate::abi::oxcclComm_t;
use crate::boundary::Failure;
use crate::entry::Entry;

static LIVE: Mutex<BTreeMap<usize, Arc<Entry>>> = Mutex::new(BTreeMap::new());

/// The first handle; ids have the top bit set, which no user-space address has on the 64-bit
/// platforms oxccl runs on, so a foreign pointer never matches one.
const FIRST: usize = (usize::MAX >> 1) + 1;
/// Spacing of ids, so that they look like aligned pointers to tools that print them.
const STEP: usize = 16;
static NEXT: AtomicUsize = AtomicUsize::new(FIRST);

fn live() -> std::sync::MutexGuard<'static, BTreeMap<usize, Arc<Entry>>> {
    LIVE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A new id: never given before, never a user-space address (also used for the handles of
/// memory registrations).
pub(crate) fn fresh_id() -> usize {
    NEXT.fetch_add(STEP, Ordering::Relaxed)
}

/// Registers `entry` and returns its new handle.
pub(crate) fn register(entry: Arc<Entry>) -> oxcclComm_t {
    let id = fresh_id();
    live().insert(id, entry);
    std::ptr::without_provenance_mut(id)
}

fn unknown(handle: oxcclComm_t, what: &str) -> Failure {
    if handle.is_null() {
        Failure::invalid(format!("{what} is NULL"))
    } else {
        Failure::invalid(format!(
            "{what} ({handle:p}) is not a live communicator: it was destroyed or aborted, or \
             did not come from oxcclCommInit*"
        ))
    }
}

/// Handles a thread keeps in its cache.
const CACHED: usize = 8;

thread_local! {
    static RECENT: RefCell<Vec<(usize, Weak<Entry>)>> = const { RefCell::new(Vec::new()) };
}

/// The cached entry of `id`, if it is still registered.
fn cached(id: usize) -> Option<Arc<Entry>> {
    RECENT
        .try_with(|r| {
            let r = r.try_borrow().ok()?;
            let e = r.iter().find(|(i, _)| *i == id)?.1.upgrade()?;
            e.registered_now().then_some(e)
        })
        .ok()
        .flatten()
}

/// Puts `entry`, found for `id`, in this thread's cache.
fn remember(id: usize, entry: &Arc<Entry>) {
    let _ = RECENT.try_with(|r| {
        if let Ok(mut r) = r.try_borrow_mut() {
            r.retain(|(i, w)| *i != id && w.strong_count() > 0);
            if r.len() >= CACHED {
                r.remove(0);
            }
            r.push((id, Arc::downgrade(entry)));
        }
    });
}

/// The entry of `handle` (the argument `what`).
pub(crate) fn get(handle: oxcclComm_t, what: &str) -> Result<Arc<Entry>, Failure> {
    let id = handle as usize;
    if let Some(e) = cached(id) {
        return Ok(e);
    }
    let e = live()
        .get(&id)
        .cloned()
        .ok_or_else(|| unknown(handle, what))?;
    remember(id, &e);
    Ok(e)
}

/// Unregisters `handle` and returns its entry; the communicator closes when the last call
/// still using it returns.
pub(crate) fn remove(handle: oxcclComm_t, what: &str) -> Result<Arc<Entry>, Failure> {
    let e = live()
        .remove(&(handle as usize))
        .ok_or_else(|| unknown(handle, what))?;
    // Every thread's cache now misses it.
    e.unregister();
    Ok(e)
}
