//! Versions, unique ids, creating and destroying communicators, queries and error strings.

use std::ffi::{c_char, c_int};
use std::sync::Arc;

use oxccl_core::bootstrap::UniqueId;
use oxccl_core::{Communicator, Config};

use crate::abi::*;
use crate::boundary::{
    Failure, Outcome, error_string, guard, last_error, non_null, set_last_error,
};
use crate::dispatch::{Creation, create};
use crate::entry::Entry;
use crate::handles;

/// This library's version as `major * 10000 + minor * 100 + patch` (NCCL's encoding).
const VERSION_CODE: c_int = {
    const fn parse(s: &str) -> c_int {
        let b = s.as_bytes();
        let mut v = 0;
        let mut i = 0;
        while i < b.len() {
            v = v * 10 + (b[i] - b'0') as c_int;
            i += 1;
        }
        v
    }
    parse(env!("CARGO_PKG_VERSION_MAJOR")) * 10000
        + parse(env!("CARGO_PKG_VERSION_MINOR")) * 100
        + parse(env!("CARGO_PKG_VERSION_PATCH"))
};

/// Stores the library version, `major * 10000 + minor * 100 + patch`, in `*version`.
///
/// # Safety
///
/// `version` is NULL (an error) or valid for writing one `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclGetVersion(version: *mut c_int) -> oxcclResult_t {
    guard("oxcclGetVersion", || {
        non_null(version, "version")?;
        // SAFETY: not NULL, and the caller guarantees it points to a writable int.
        unsafe { version.write(VERSION_CODE) };
        Ok(())
    })
}

/// Makes a new unique id in `*uniqueId`: starts a store server in this process (it lives until
/// the process exits) that the ranks of one communicator meet at. Call it on one rank, then
/// send the id to every rank.
///
/// # Safety
///
/// `uniqueId` is NULL (an error) or valid for writing one `oxcclUniqueId`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclGetUniqueId(uniqueId: *mut oxcclUniqueId) -> oxcclResult_t {
    guard("oxcclGetUniqueId", || {
        non_null(uniqueId, "uniqueId")?;
        let id = UniqueId::new()?;
        let mut out = oxcclUniqueId {
            internal: [0; OXCCL_UNIQUE_ID_BYTES],
        };
        for (o, b) in out.internal.iter_mut().zip(id.as_bytes()) {
            *o = *b as c_char;
        }
        // SAFETY: not NULL, and the caller guarantees it points to a writable oxcclUniqueId
        // (which has no alignment beyond 1).
        unsafe { uniqueId.write(out) };
        Ok(())
    })
}

/// The version `OXCCL_CONFIG_INITIALIZER` writes: the NCCL version whose `ncclConfig_t`
/// layout `oxcclConfig_t` has (2.27.5).
pub const OXCCL_CONFIG_VERSION: u32 = 22705;

/// The oldest `version` a config may carry: NCCL 2.14, which introduced `ncclConfig_t`.
const OLDEST_CONFIG: u32 = 21400;

/// Whether calls on a new communicator block, from the caller's `config` (NULL: they do).
/// Checked as NCCL does: `size` covers at least the fields up to `blocking`, `magic` is
/// `OXCCL_CONFIG_MAGIC`, `version` is plausible; fields past the caller's `size` (an older,
/// smaller layout) count as undefined.
///
/// # Safety
///
/// `config` is NULL or readable for its own `size` field's bytes (at least the `size` field).
unsafe fn blocking(config: *const oxcclConfig_t) -> Result<bool, Failure> {
    if config.is_null() {
        return Ok(true);
    }
    let undefined = oxcclConfig_t {
        size: 0,
        magic: 0,
        version: 0,
        blocking: OXCCL_CONFIG_UNDEF_INT,
        cgaClusterSize: OXCCL_CONFIG_UNDEF_INT,
        minCTAs: OXCCL_CONFIG_UNDEF_INT,
        maxCTAs: OXCCL_CONFIG_UNDEF_INT,
        netName: std::ptr::null(),
        splitShare: OXCCL_CONFIG_UNDEF_INT,
        trafficClass: OXCCL_CONFIG_UNDEF_INT,
        commName: std::ptr::null(),
        collnetEnable: OXCCL_CONFIG_UNDEF_INT,
        CTAPolicy: OXCCL_CONFIG_UNDEF_INT,
        shrinkShare: OXCCL_CONFIG_UNDEF_INT,
        nvlsCTAs: OXCCL_CONFIG_UNDEF_INT,
    };
    // SAFETY: the caller guarantees the size field is readable; the struct may be unaligned.
    let size = unsafe { config.cast::<usize>().read_unaligned() };
    let needed = std::mem::offset_of!(oxcclConfig_t, blocking) + std::mem::size_of::<c_int>();
    if size < needed {
        return Err(Failure::invalid(format!(
            "config: its size is {size} bytes, less than the {needed} of the oldest layout: \
             initialize it with OXCCL_CONFIG_INITIALIZER"
        )));
    }
    let mut c = undefined;
    let n = size.min(std::mem::size_of::<oxcclConfig_t>());
    // SAFETY: the caller's struct is readable for its `size` bytes, of which we copy at most
    // our own struct's size into a local of that type; every bit pattern is a valid
    // oxcclConfig_t (ints and pointers that are never dereferenced).
    unsafe { std::ptr::copy_nonoverlapping(config.cast::<u8>(), (&raw mut c).cast::<u8>(), n) };
    if c.magic != OXCCL_CONFIG_MAGIC {
        return Err(Failure::invalid(format!(
            "config: magic is {:#x}, not {OXCCL_CONFIG_MAGIC:#x}: initialize it with \
             OXCCL_CONFIG_INITIALIZER",
            c.magic
        )));
    }
    if c.version < OLDEST_CONFIG {
        return Err(Failure::invalid(format!(
            "config: version {} is older than {OLDEST_CONFIG} (NCCL 2.14, the first with a \
             config): initialize it with OXCCL_CONFIG_INITIALIZER",
            c.version
        )));
    }
    match c.blocking {
        OXCCL_CONFIG_UNDEF_INT | 1 => Ok(true),
        0 => Ok(false),
        other => Err(Failure::invalid(format!(
            "config: blocking is {other}, not 0, 1 or OXCCL_CONFIG_UNDEF_INT"
        ))),
    }
}

/// The (size, rank) of a rank's creation call.
fn size_and_rank(nranks: c_int, rank: c_int) -> Result<(usize, usize), Failure> {
    let n = usize::try_from(nranks)
        .ok()
        .filter(|&n| n > 0 && n <= oxccl_core::MAX_RANKS)
        .ok_or_else(|| {
            Failure::invalid(format!(
                "nranks: {nranks} is not from 1 to {} (the most ranks a communicator has)",
                oxccl_core::MAX_RANKS
            ))
        })?;
    let r = usize::try_from(rank)
        .ok()
        .filter(|&r| r < n)
        .ok_or_else(|| Failure::invalid(format!("rank: {rank} is not in 0..{nranks} (nranks)")))?;
    Ok((n, r))
}

/// The unique id in `raw`, the argument `what`.
fn unique_id(raw: &oxcclUniqueId, what: &str) -> Result<UniqueId, Failure> {
    let bytes: [u8; OXCCL_UNIQUE_ID_BYTES] = raw.internal.map(|c| c as u8);
    UniqueId::from_bytes(&bytes).map_err(|e| {
        Failure::invalid(format!(
            "{what} is not an id from oxcclGetUniqueId (or was damaged on the way): {e}"
        ))
    })
}

/// Creates a rank's communicator from `id` (see `dispatch::create`).
///
/// # Safety
///
/// `comm` is writable (checked not NULL here); until `oxcclGroupEnd` inside a group.
unsafe fn create_rank(
    comm: *mut oxcclComm_t,
    n: usize,
    r: usize,
    id: UniqueId,
    blocking: bool,
) -> Outcome {
    // SAFETY: the caller's contract.
    unsafe { create_rank_with(comm, n, r, id, blocking, Config::from_env()?) }
}

/// `create_rank` with a configuration already read.
///
/// # Safety
///
/// As for `create_rank`.
unsafe fn create_rank_with(
    comm: *mut oxcclComm_t,
    n: usize,
    r: usize,
    id: UniqueId,
    blocking: bool,
    config: Config,
) -> Outcome {
    let make = Box::new(move || Ok(Some(Communicator::init_rank(&id, n, r, config)?)));
    // SAFETY: the caller's contract.
    unsafe {
        create(Creation {
            out: comm,
            blocking,
            make,
        })
    }
}

/// Creates rank `rank` of a communicator of `nranks` ranks that meet through `commId`
/// (nccl.h's `ncclCommInitRank`). Every rank calls it with the same id and `nranks`; it
/// returns when all have joined, or fails after `OXCCL_TIMEOUT` seconds. The configuration
/// comes from the `OXCCL_*` environment variables. Inside a group, the communicator is
/// created by `oxcclGroupEnd` (so one thread can create several ranks).
///
/// # Safety
///
/// `comm` is NULL (an error) or valid for writing one `oxcclComm_t` (until `oxcclGroupEnd`
/// inside a group).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclCommInitRank(
    comm: *mut oxcclComm_t,
    nranks: c_int,
    commId: oxcclUniqueId,
    rank: c_int,
) -> oxcclResult_t {
    guard("oxcclCommInitRank", || {
        non_null(comm, "comm")?;
        let (n, r) = size_and_rank(nranks, rank)?;
        let id = unique_id(&commId, "commId")?;
        // SAFETY: `comm` was checked above; the caller guarantees it is writable.
        unsafe { create_rank(comm, n, r, id, true) }
    })
}

/// `oxcclCommInitRank` with options (nccl.h's `ncclCommInitRankConfig`); `config` may be NULL.
/// With `config->blocking = 0` the call returns `oxcclInProgress` at once with the handle in
/// `*comm`, and the communicator is created in the background: poll
/// `oxcclCommGetAsyncError` until it reports `oxcclSuccess` (or a failure) before using it.
///
/// # Safety
///
/// `comm` is NULL (an error) or valid for writing one `oxcclComm_t`; `config` is NULL or
/// readable for its `size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclCommInitRankConfig(
    comm: *mut oxcclComm_t,
    nranks: c_int,
    commId: oxcclUniqueId,
    rank: c_int,
    config: *mut oxcclConfig_t,
) -> oxcclResult_t {
    guard("oxcclCommInitRankConfig", || {
        non_null(comm, "comm")?;
        let (n, r) = size_and_rank(nranks, rank)?;
        let id = unique_id(&commId, "commId")?;
        // SAFETY: the caller's contract for `config`.
        let blocking = unsafe { blocking(config) }?;
        // SAFETY: `comm` was checked above; the caller guarantees it is writable.
        unsafe { create_rank(comm, n, r, id, blocking) }
    })
}

/// Longest `options` string `oxcclCommInitRankOptions` reads.
const MAX_OPTIONS: usize = 64 << 10;

/// The configuration of a communicator: the `OXCCL_*` environment variables, with `options`
/// (`NAME=VALUE` settings separated by `;`) in place of the variables they name.
fn config_with(options: &str) -> Result<Config, Failure> {
    let mut set: Vec<(&str, &str)> = Vec::new();
    for item in options.split(';').map(str::trim).filter(|i| !i.is_empty()) {
        let Some((name, value)) = item.split_once('=') else {
            return Err(Failure::invalid(format!(
                "options: {item:?} is not NAME=VALUE (settings are separated by ';')"
            )));
        };
        let name = name.trim();
        if set.iter().any(|(n, _)| *n == name) {
            return Err(Failure::invalid(format!("options: {name} is set twice")));
        }
        set.push((name, value.trim()));
    }
    let read = std::cell::RefCell::new(Vec::new());
    let config = Config::from_env_with(|var| {
        read.borrow_mut().push(var.to_owned());
        set.iter()
            .find(|(n, _)| *n == var)
            .map(|(_, v)| (*v).to_owned())
    })?;
    let read = read.into_inner();
    if let Some((name, _)) = set.iter().find(|(n, _)| !read.iter().any(|r| r == n)) {
        return Err(Failure::invalid(format!(
            "options: {name:?} is not a setting of a communicator (those are {})",
            read.join(", ")
        )));
    }
    Ok(config)
}

/// Extension: `oxcclCommInitRankConfig` with `options`, settings of this communicator that take
/// the place of the `OXCCL_*` environment variables of the same names (`"OXCCL_TIMEOUT=30;
/// OXCCL_TRANSPORTS=shm,tcp"`: `NAME=VALUE` separated by `;`; NULL or empty: none), so that
/// communicators of one process may differ without anybody changing the process's
/// environment (which other threads may be reading). A name that is not such a setting, a
/// name given twice or a value the variable would refuse is `oxcclInvalidArgument`. The
/// settings are read during the call (inside a group too); `config` may be NULL.
///
/// # Safety
///
/// `comm` is NULL (an error) or valid for writing one `oxcclComm_t`; `config` is NULL or
/// readable for its `size` bytes; `options` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclCommInitRankOptions(
    comm: *mut oxcclComm_t,
    nranks: c_int,
    commId: oxcclUniqueId,
    rank: c_int,
    config: *mut oxcclConfig_t,
    options: *const c_char,
) -> oxcclResult_t {
    guard("oxcclCommInitRankOptions", || {
        non_null(comm, "comm")?;
        let (n, r) = size_and_rank(nranks, rank)?;
        let id = unique_id(&commId, "commId")?;
        // SAFETY: the caller's contract for `config`.
        let blocking = unsafe { blocking(config) }?;
        // SAFETY: the caller's contract for `options`.
        let config = match unsafe { options_config(options) }? {
            Some(c) => c,
            None => Config::from_env()?,
        };
        // SAFETY: `comm` was checked above; the caller guarantees it is writable.
        unsafe { create_rank_with(comm, n, r, id, blocking, config) }
    })
}

/// The bytes of the NUL-terminated string at `p` (not NULL) if its NUL comes within `max`
/// bytes.
///
/// # Safety
///
/// `p` points to a NUL-terminated string.
unsafe fn bounded_c_str<'a>(p: *const c_char, max: usize) -> Option<&'a [u8]> {
    for len in 0..=max {
        // SAFETY: bytes before the NUL are readable (the caller's contract), and the loop
        // stops at the first NUL.
        if unsafe { p.add(len).read() } == 0 {
            // SAFETY: `len` readable bytes, checked one by one above.
            return Some(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) });
        }
    }
    None
}

/// Most ids `oxcclCommInitRankScalable` reads.
const MAX_IDS: c_int = 1 << 16;

/// `oxcclCommInitRankConfig` with several ids (nccl.h's `ncclCommInitRankScalable`, which
/// spreads the bootstrap over several roots). oxccl's ranks meet at one store, so the first id
/// is used; the others are only checked to be well formed (as in NCCL, every rank must pass the
/// same ids; a rank whose first id differs never meets the others, and creation times out
/// naming the rank it waited for). `nId` is 1 to nranks.
///
/// # Safety
///
/// `newcomm` is NULL (an error) or valid for writing one `oxcclComm_t`; `commIds` is NULL (an
/// error) or readable for `nId` ids; `config` is NULL or readable for its `size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclCommInitRankScalable(
    newcomm: *mut oxcclComm_t,
    nranks: c_int,
    myrank: c_int,
    nId: c_int,
    commIds: *mut oxcclUniqueId,
    config: *mut oxcclConfig_t,
) -> oxcclResult_t {
    guard("oxcclCommInitRankScalable", || {
        non_null(newcomm, "newcomm")?;
        let (n, r) = size_and_rank(nranks, myrank)?;
        non_null(commIds, "commIds")?;
        if nId < 1 || nId > nranks.min(MAX_IDS) {
            return Err(Failure::invalid(format!(
                "nId: {nId} is not in 1..={} (nranks)",
                nranks.min(MAX_IDS)
            )));
        }
        let mut first = None;
        for i in 0..nId as usize {
            // SAFETY: the caller guarantees `nId` readable ids; i < nId.
            let raw = unsafe { commIds.add(i).read_unaligned() };
            let id = unique_id(&raw, &format!("commIds[{i}]"))?;
            first.get_or_insert(id);
        }
        let id = first.ok_or_else(|| Failure::invalid("commIds: no id"))?;
        // SAFETY: the caller's contract for `config`.
        let blocking = unsafe { blocking(config) }?;
        // SAFETY: `newcomm` was checked above; the caller guarantees it is writable.
        unsafe { create_rank(newcomm, n, r, id, blocking) }
    })
}

/// Creates `ndev` communicators that are ranks 0 to `ndev - 1` of one communicator inside this
/// process (nccl.h's `ncclCommInitAll`), in `comms[0..ndev]`. Drive each from its own thread,
/// or all from one thread inside a group: a collective completes only when every rank has
/// called it. `devlist` (CUDA devices) may be NULL and is ignored by this host-memory build.
///
/// # Safety
///
/// `comms` is NULL (an error) or valid for writing `ndev` handles; `devlist` is NULL or valid
/// for reading `ndev` ints.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclCommInitAll(
    comms: *mut oxcclComm_t,
    ndev: c_int,
    devlist: *const c_int,
) -> oxcclResult_t {
    let _ = devlist;
    guard("oxcclCommInitAll", || {
        non_null(comms, "comms")?;
        let n = usize::try_from(ndev)
            .ok()
            .filter(|&n| n > 0 && n <= oxccl_core::MAX_LOCAL_RANKS)
            .ok_or_else(|| {
                Failure::invalid(format!(
                    "ndev: {ndev} is not from 1 to {} (ranks in one process)",
                    oxccl_core::MAX_LOCAL_RANKS
                ))
            })?;
        let all = Communicator::init_local(n, Config::from_env()?)?;
        for (i, c) in all.into_iter().enumerate() {
            let handle = handles::register(Arc::new(Entry::ready(c, true)));
            // SAFETY: `comms` is not NULL and the caller guarantees room for `ndev` handles;
            // i < ndev.
            unsafe { comms.add(i).write(handle) };
        }
        Ok(())
    })
}

/// Extension: creates this process's communicator from a launcher's environment (oxrun's
/// `OXCCL_*` variables, torchrun, Slurm, Open MPI or PMI), with the configuration of the
/// `OXCCL_*` variables: the C form of `oxccl::Communicator::init`.
///
/// # Safety
///
/// `comm` is NULL (an error) or valid for writing one `oxcclComm_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclCommInitFromEnv(comm: *mut oxcclComm_t) -> oxcclResult_t {
    guard("oxcclCommInitFromEnv", || {
        non_null(comm, "comm")?;
        let c = Communicator::init(Config::from_env()?)?;
        let handle = handles::register(Arc::new(Entry::ready(c, true)));
        // SAFETY: `comm` was checked above; the caller guarantees it is writable.
        unsafe { comm.write(handle) };
        Ok(())
    })
}

/// Splits `comm` (nccl.h's `ncclCommSplit`): every rank of `comm` calls it; the ranks with the
/// same `color` form a new communicator, ordered by `key` then by their rank in `comm`, whose
/// handle goes to `*newcomm`; a rank with `OXCCL_SPLIT_NOCOLOR` gets NULL. `config` may be
/// NULL (the new communicator blocks as `comm` does). Inside a group, the split happens at
/// `oxcclGroupEnd`.
///
/// # Safety
///
/// `newcomm` is NULL (an error) or valid for writing one `oxcclComm_t` (until `oxcclGroupEnd`
/// inside a group); `config` is NULL or readable for its `size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclCommSplit(
    comm: oxcclComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut oxcclComm_t,
    config: *mut oxcclConfig_t,
) -> oxcclResult_t {
    // SAFETY: the caller's contract, passed on.
    guard("oxcclCommSplit", || unsafe {
        split(comm, color, key, newcomm, config, None)
    })
}

/// Extension: `oxcclCommSplit` whose new communicator takes its settings from `options`
/// (`NAME=VALUE` separated by `;`, as `oxcclCommInitRankOptions` takes them: in place of the
/// `OXCCL_*` environment variables of those names, the rest from the environment) instead of
/// from `comm`; NULL: as `oxcclCommSplit`. The torch backend gives each subgroup made by a
/// split its own timeout this way. Every member must pass alike settings.
///
/// # Safety
///
/// As `oxcclCommSplit`; `options` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclCommSplitOptions(
    comm: oxcclComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut oxcclComm_t,
    config: *mut oxcclConfig_t,
    options: *const c_char,
) -> oxcclResult_t {
    guard("oxcclCommSplitOptions", || {
        // SAFETY: the caller's contract for `options`.
        let own = unsafe { options_config(options) }?;
        // SAFETY: the caller's contract, passed on.
        unsafe { split(comm, color, key, newcomm, config, own) }
    })
}

/// The configuration `options` (NULL: none) gives a communicator, or None for NULL.
///
/// # Safety
///
/// `options` is NULL or a NUL-terminated string.
unsafe fn options_config(options: *const c_char) -> Result<Option<Config>, Failure> {
    if options.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller guarantees a NUL-terminated string; read at most MAX_OPTIONS bytes
    // before its NUL.
    let bytes = unsafe { bounded_c_str(options, MAX_OPTIONS) }
        .ok_or_else(|| Failure::invalid(format!("options: longer than {MAX_OPTIONS} bytes")))?;
    let text = std::str::from_utf8(bytes).map_err(|_| Failure::invalid("options: not UTF-8"))?;
    config_with(text).map(Some)
}

/// `oxcclCommSplit`, the new communicator made with `own` settings if given.
///
/// # Safety
///
/// As `oxcclCommSplit`.
unsafe fn split(
    comm: oxcclComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut oxcclComm_t,
    config: *mut oxcclConfig_t,
    own: Option<Config>,
) -> Outcome {
    {
        let parent = handles::get(comm, "comm")?;
        non_null(newcomm, "newcomm")?;
        parent.for_operation()?;
        let color = match color {
            OXCCL_SPLIT_NOCOLOR => None,
            c => Some(u32::try_from(c).map_err(|_| {
                Failure::invalid(format!(
                    "color: {c} is neither non-negative nor OXCCL_SPLIT_NOCOLOR (-1)"
                ))
            })?),
        };
        // Keys order the new ranks: shift them so that u32 order is int order.
        let key = (key as u32) ^ 0x8000_0000;
        // A rank that joins nothing learns it when the split is done: it waits for it.
        let blocking = if color.is_none() {
            true
        } else if config.is_null() {
            parent.blocking
        } else {
            // SAFETY: the caller's contract for `config`.
            unsafe { blocking(config) }?
        };
        let make = Box::new(move || {
            // The split is a collective of the parent: its earlier operations finish first.
            parent.drain()?;
            let c = parent.comm()?;
            Ok(match own {
                Some(config) => c.split_with(color, key, config)?,
                None => c.split(color, key)?,
            })
        });
        // SAFETY: `newcomm` was checked above; the caller guarantees it is writable.
        unsafe {
            create(Creation {
                out: newcomm,
                blocking,
                make,
            })
        }
    }
}

/// Shrinks `comm` (nccl.h's `ncclCommShrink`, NCCL 2.27): the ranks not in
/// `excludeRanksList` (`excludeRanksCount` ranks of `comm`) form a new communicator, in the
/// same order, whose handle goes to `*newcomm` — also, and above all, when `comm` failed
/// because a peer died (`oxcclRemoteError`): the survivors go on without a restart. Every rank
/// not excluded calls it with the same list. `shrinkFlags`: `OXCCL_SHRINK_DEFAULT` (0) first
/// waits for `comm`'s earlier operations (their failures do not stop the shrink);
/// `OXCCL_SHRINK_ABORT` (1) aborts them first. `config` may be NULL (the new communicator
/// blocks as `comm` does). The ranks meet through `comm`'s store, which must outlive the
/// excluded ranks.
///
/// # Safety
///
/// `excludeRanksList` is readable for `excludeRanksCount` ints (may be NULL when that is 0);
/// `newcomm` is NULL (an error) or valid for writing one `oxcclComm_t`; `config` is NULL or
/// readable for its `size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclCommShrink(
    comm: oxcclComm_t,
    excludeRanksList: *mut c_int,
    excludeRanksCount: c_int,
    newcomm: *mut oxcclComm_t,
    config: *mut oxcclConfig_t,
    shrinkFlags: c_int,
) -> oxcclResult_t {
    guard("oxcclCommShrink", || {
        let parent = handles::get(comm, "comm")?;
        non_null(newcomm, "newcomm")?;
        let size = parent.comm()?.size();
        let count = usize::try_from(excludeRanksCount)
            .ok()
            .filter(|&n| n < size)
            .ok_or_else(|| {
                Failure::invalid(format!(
                    "excludeRanksCount: {excludeRanksCount} is not from 0 to {} (comm has {size} \
                     ranks, and one must remain)",
                    size - 1
                ))
            })?;
        let list: Vec<usize> = if count == 0 {
            Vec::new()
        } else {
            non_null(excludeRanksList, "excludeRanksList")?;
            // SAFETY: checked non-null; the caller guarantees `count` readable ints.
            let raw = unsafe { std::slice::from_raw_parts(excludeRanksList, count) };
            raw.iter()
                .map(|&r| {
                    usize::try_from(r)
                        .ok()
                        .filter(|&r| r < size)
                        .ok_or_else(|| {
                            Failure::invalid(format!(
                                "excludeRanksList: {r} is not a rank of comm (0 to {})",
                                size - 1
                            ))
                        })
                })
                .collect::<Result<_, _>>()?
        };
        let abort = match shrinkFlags {
            OXCCL_SHRINK_DEFAULT => false,
            OXCCL_SHRINK_ABORT => true,
            f => {
                return Err(Failure::invalid(format!(
                    "shrinkFlags: {f} is neither OXCCL_SHRINK_DEFAULT (0) nor OXCCL_SHRINK_ABORT (1)"
                )));
            }
        };
        let blocking = if config.is_null() {
            parent.blocking
        } else {
            // SAFETY: the caller's contract for `config`.
            unsafe { blocking(config) }?
        };
        let make = Box::new(move || {
            if abort {
                parent.comm()?.abort();
            }
            // What failed is why we shrink: earlier operations only have to be over.
            let _ = parent.drain();
            Ok(Some(parent.comm()?.shrink(&list)?))
        });
        // SAFETY: `newcomm` was checked above; the caller guarantees it is writable.
        unsafe {
            create(Creation {
                out: newcomm,
                blocking,
                make,
            })
        }
    })
}

/// Finishes `comm`'s operations (nccl.h's `ncclCommFinalize`): afterwards it takes no new
/// ones, and `oxcclCommDestroy` frees it. Blocking communicators return when every operation
/// is done, with the first failure among them; non-blocking ones return `oxcclInProgress`
/// until then (poll `oxcclCommGetAsyncError`).
#[unsafe(no_mangle)]
pub extern "C" fn oxcclCommFinalize(comm: oxcclComm_t) -> oxcclResult_t {
    guard("oxcclCommFinalize", || {
        let entry = handles::get(comm, "comm")?;
        entry.comm()?;
        entry.finalize();
        if entry.blocking {
            return entry.drain();
        }
        match entry.poll() {
            oxcclSuccess => Ok(()),
            oxcclInProgress => Err(Failure::in_progress()),
            code => Err(entry.failure().unwrap_or_else(|| Failure {
                code,
                message: "an operation of comm failed".into(),
            })),
        }
    })
}

/// Destroys `comm`: its handle becomes invalid at once; its operations still running finish
/// first (so their buffers are free when this returns), then its connections close (after the
/// calls other threads are still making on it return). Every rank destroys its own.
#[unsafe(no_mangle)]
pub extern "C" fn oxcclCommDestroy(comm: oxcclComm_t) -> oxcclResult_t {
    guard("oxcclCommDestroy", || {
        let entry = handles::remove(comm, "comm")?;
        crate::dispatch::dropped_in_group(&entry, "destroyed");
        // Their failures were reported (or are moot): the buffers are what matters here.
        let _ = entry.drain();
        entry.drain_requests();
        Ok(())
    })
}

/// Aborts and destroys `comm` from any thread: running and later calls on it fail (with
/// `oxcclRemoteError`), the peers are told (their calls fail naming this rank), and the handle
/// becomes invalid. A communicator still being created (non-blocking) cannot be interrupted:
/// its creation ends on its own (within `OXCCL_TIMEOUT`) and it is then closed.
#[unsafe(no_mangle)]
pub extern "C" fn oxcclCommAbort(comm: oxcclComm_t) -> oxcclResult_t {
    guard("oxcclCommAbort", || {
        let entry = handles::remove(comm, "comm")?;
        crate::dispatch::dropped_in_group(&entry, "aborted");
        if let Ok(c) = entry.comm() {
            c.abort();
        }
        let _ = entry.drain();
        entry.drain_requests();
        Ok(())
    })
}

/// Stores in `*asyncError` the state of `comm` (nccl.h's `ncclCommGetAsyncError`):
/// `oxcclInProgress` while its creation or a non-blocking operation runs, the failure that
/// broke it if one did (a peer's failure, a timeout: the communicator is then unusable, and
/// `oxcclGetLastError` of the failing call named the cause, and so does this call's when it
/// reports one), `oxcclSuccess` otherwise. A peer whose heartbeats went silent while no call
/// ran breaks nothing yet (`oxcclCommFailedPeer` tells of it).
///
/// # Safety
///
/// `asyncError` is NULL (an error) or valid for writing one `oxcclResult_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclCommGetAsyncError(
    comm: oxcclComm_t,
    asyncError: *mut oxcclResult_t,
) -> oxcclResult_t {
    guard("oxcclCommGetAsyncError", || {
        let entry = handles::get(comm, "comm")?;
        non_null(asyncError, "asyncError")?;
        let state = entry.poll();
        if state != oxcclSuccess
            && state != oxcclInProgress
            && let Some(f) = entry.failure()
        {
            // What broke it, for oxcclGetLastError (the call itself succeeded).
            set_last_error(&format!("oxcclCommGetAsyncError: {}", f.message));
        }
        // SAFETY: not NULL, and the caller guarantees it is writable.
        unsafe { asyncError.write(state) };
        Ok(())
    })
}

/// Extension: stores in `*peer` a rank that `comm` has seen fail while it was idle or busy
/// (its heartbeats went silent: `OXCCL_HEARTBEAT`), or -1 while it knows of none. Nothing is
/// broken by asking: the next call that needs that rank fails naming it. For a caller waiting
/// for that rank elsewhere (the torch backend, while it makes the communicator of a pair of
/// ranks) and for watchdogs. Only the first rank seen failing is told (`oxcclCommPeerFailed`
/// answers for any rank).
///
/// # Safety
///
/// `peer` is NULL (an error) or valid for writing one `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclCommFailedPeer(comm: oxcclComm_t, peer: *mut c_int) -> oxcclResult_t {
    guard("oxcclCommFailedPeer", || {
        let entry = handles::get(comm, "comm")?;
        let c = entry.comm()?;
        non_null(peer, "peer")?;
        let failed = c
            .failed_peer()
            .and_then(|(p, _)| c_int::try_from(p).ok())
            .unwrap_or(-1);
        // SAFETY: not NULL, and the caller guarantees it is writable.
        unsafe { peer.write(failed) };
        Ok(())
    })
}

/// Extension: stores in `*failed` 1 if `comm` has seen rank `peer` fail (its heartbeats went
/// silent: `OXCCL_HEARTBEAT`), else 0. Unlike `oxcclCommFailedPeer`, which tells only the first
/// rank seen failing, this answers for any rank: a caller waiting for `peer` elsewhere learns
/// of its death even when another rank died first. Nothing is broken by asking.
///
/// # Safety
///
/// `failed` is NULL (an error) or valid for writing one `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclCommPeerFailed(
    comm: oxcclComm_t,
    peer: c_int,
    failed: *mut c_int,
) -> oxcclResult_t {
    guard("oxcclCommPeerFailed", || {
        let entry = handles::get(comm, "comm")?;
        let c = entry.comm()?;
        non_null(failed, "failed")?;
        let size = c.size();
        let p = usize::try_from(peer)
            .ok()
            .filter(|&p| p < size)
            .ok_or_else(|| {
                Failure::invalid(format!(
                    "oxcclCommPeerFailed: peer {peer} is not a rank of this communicator of \
                     {size} ranks (rank {})",
                    c.rank()
                ))
            })?;
        let seen = c_int::from(c.failed_peers().contains(&p));
        // SAFETY: not NULL, and the caller guarantees it is writable.
        unsafe { failed.write(seen) };
        Ok(())
    })
}

/// Stores in `*device` the CUDA device of `comm`: -1, as this host-memory build's
/// communicators have none.
///
/// # Safety
///
/// `device` is NULL (an error) or valid for writing one `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclCommCuDevice(comm: oxcclComm_t, device: *mut c_int) -> oxcclResult_t {
    guard("oxcclCommCuDevice", || {
        let entry = handles::get(comm, "comm")?;
        entry.comm()?;
        non_null(device, "device")?;
        // SAFETY: not NULL, and the caller guarantees it is writable.
        unsafe { device.write(-1) };
        Ok(())
    })
}

/// Stores the number of ranks of `comm` in `*count`.
///
/// # Safety
///
/// `count` is NULL (an error) or valid for writing one `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclCommCount(comm: oxcclComm_t, count: *mut c_int) -> oxcclResult_t {
    guard("oxcclCommCount", || {
        let entry = handles::get(comm, "comm")?;
        let c = entry.comm()?;
        non_null(count, "count")?;
        let n = c_int::try_from(c.size())
            .map_err(|_| Failure::invalid("count: the size does not fit in an int"))?;
        // SAFETY: not NULL, and the caller guarantees it points to a writable int.
        unsafe { count.write(n) };
        Ok(())
    })
}

/// Stores the rank of `comm` in `*rank`.
///
/// # Safety
///
/// `rank` is NULL (an error) or valid for writing one `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oxcclCommUserRank(comm: oxcclComm_t, rank: *mut c_int) -> oxcclResult_t {
    guard("oxcclCommUserRank", || {
        let entry = handles::get(comm, "comm")?;
        let c = entry.comm()?;
        non_null(rank, "rank")?;
        let r = c_int::try_from(c.rank())
            .map_err(|_| Failure::invalid("rank: the rank does not fit in an int"))?;
        // SAFETY: not NULL, and the caller guarantees it points to a writable int.
        unsafe { rank.write(r) };
        Ok(())
    })
}

/// A static, NUL-terminated description of `result` (any value; unknown ones get
/// "unknown result code"). Never NULL; never free it.
#[unsafe(no_mangle)]
pub extern "C" fn oxcclGetErrorString(result: oxcclResult_t) -> *const c_char {
    error_string(result).as_ptr()
}

/// The message of the last failed oxccl call on the calling thread ("" if none), naming the
/// function, the argument or the rank at fault. NUL-terminated; valid until the next failing
/// oxccl call on this thread; never free it. `comm` is not used and may be NULL.
#[unsafe(no_mangle)]
pub extern "C" fn oxcclGetLastError(comm: oxcclComm_t) -> *const c_char {
    let _ = comm;
    last_error()
}
