//! The exported functions called as C would call them: every error path of the boundary, and
//! every collective on 1, 2 and 3 ranks of `oxcclCommInitAll` driven from one thread each.
//! (They live in the crate because it was a cdylib and a staticlib only when they were
//! written; it has an rlib now, for nccl/.)

use std::ffi::{CStr, c_int, c_void};
use std::ptr::{null, null_mut};

use crate::*;

/// This thread's last error message.
fn last() -> String {
    // SAFETY: oxcclGetLastError returns a NUL-terminated string valid until this thread's next
    // failing call; it is copied at once.
    unsafe { CStr::from_ptr(oxcclGetLastError(null_mut())) }
        .to_string_lossy()
        .into_owned()
}

/// Asserts that `result` is `code` and that the last error message contains `words`.
#[track_caller]
fn fails(result: oxcclResult_t, code: oxcclResult_t, words: &str) {
    let msg = last();
    assert_eq!(result, code, "result {result}, expected {code}: {msg}");
    assert!(msg.contains(words), "{msg:?} does not contain {words:?}");
}

#[track_caller]
fn ok(result: oxcclResult_t) {
    assert_eq!(result, oxcclSuccess, "{}", last());
}

/// A handle that can cross threads (the tests own the communicators it names).
#[derive(Clone, Copy)]
struct Comm(oxcclComm_t);
// SAFETY: a handle is an id that is never dereferenced; the tests use each from one thread.
unsafe impl Send for Comm {}
// SAFETY: as above.
unsafe impl Sync for Comm {}

impl Comm {
    /// The handle (a method, so that closures capture the whole `Send` wrapper).
    fn get(self) -> oxcclComm_t {
        self.0
    }
}

fn init_all(n: usize) -> Vec<Comm> {
    let mut comms = vec![null_mut(); n];
    // SAFETY: `comms` has room for n handles; devlist may be NULL.
    ok(unsafe { oxcclCommInitAll(comms.as_mut_ptr(), n as c_int, null()) });
    comms.into_iter().map(Comm).collect()
}

fn destroy(comms: Vec<Comm>) {
    for c in comms {
        ok(oxcclCommDestroy(c.0));
    }
}

/// Runs `f(rank, comm)` for every rank on its own thread.
fn on_each(comms: &[Comm], f: impl Fn(usize, oxcclComm_t) + Sync) {
    std::thread::scope(|s| {
        for (r, c) in comms.iter().enumerate() {
            let f = &f;
            let c = *c;
            s.spawn(move || f(r, c.get()));
        }
    });
}

fn void<T>(v: &[T]) -> *const c_void {
    v.as_ptr().cast()
}

fn void_mut<T>(v: &mut [T]) -> *mut c_void {
    v.as_mut_ptr().cast()
}

#[test]
fn version_and_error_strings() {
    let mut v = 0;
    // SAFETY: v is a writable int.
    ok(unsafe { oxcclGetVersion(&mut v) });
    assert_eq!(v, 100, "0.1.0 encodes as 100");
    for code in 0..oxcclNumResults {
        // SAFETY: a static NUL-terminated string.
        let s = unsafe { CStr::from_ptr(oxcclGetErrorString(code)) };
        assert!(!s.is_empty());
        assert_ne!(s.to_str().unwrap(), "unknown result code");
    }
    // SAFETY: as above.
    let s = unsafe { CStr::from_ptr(oxcclGetErrorString(-7)) };
    assert_eq!(s.to_str().unwrap(), "unknown result code");
}

#[test]
fn null_out_pointers_are_invalid_arguments() {
    // SAFETY: NULL out-pointers are the error under test; nothing is written.
    unsafe {
        fails(
            oxcclGetVersion(null_mut()),
            oxcclInvalidArgument,
            "version is NULL",
        );
        fails(
            oxcclGetUniqueId(null_mut()),
            oxcclInvalidArgument,
            "uniqueId is NULL",
        );
        fails(
            oxcclCommInitAll(null_mut(), 2, null()),
            oxcclInvalidArgument,
            "comms is NULL",
        );
        fails(
            oxcclCommInitFromEnv(null_mut()),
            oxcclInvalidArgument,
            "comm is NULL",
        );
        let id = oxcclUniqueId { internal: [0; 128] };
        fails(
            oxcclCommInitRank(null_mut(), 2, id, 0),
            oxcclInvalidArgument,
            "comm is NULL",
        );
    }
    let comms = init_all(1);
    // SAFETY: as above.
    unsafe {
        fails(
            oxcclCommCount(comms[0].0, null_mut()),
            oxcclInvalidArgument,
            "count is NULL",
        );
        fails(
            oxcclCommUserRank(comms[0].0, null_mut()),
            oxcclInvalidArgument,
            "rank is NULL",
        );
    }
    destroy(comms);
}

#[test]
fn bad_init_arguments_are_invalid_arguments() {
    let mut comm = null_mut();
    let id = oxcclUniqueId { internal: [0; 128] };
    // SAFETY: `comm` is writable; the arguments are the errors under test.
    unsafe {
        fails(
            oxcclCommInitAll(&mut comm, 0, null()),
            oxcclInvalidArgument,
            "ndev: 0",
        );
        fails(
            oxcclCommInitRank(&mut comm, 0, id, 0),
            oxcclInvalidArgument,
            "nranks: 0",
        );
        // Sizes no job has: refused before anything is reserved for their ranks.
        fails(
            oxcclCommInitRank(&mut comm, c_int::MAX, id, 0),
            oxcclInvalidArgument,
            "nranks: 2147483647 is not from 1 to 1048576",
        );
        fails(
            oxcclCommInitAll(&mut comm, c_int::MAX, null()),
            oxcclInvalidArgument,
            "ndev: 2147483647 is not from 1 to 256",
        );
        fails(
            oxcclCommInitAll(&mut comm, 257, null()),
            oxcclInvalidArgument,
            "ndev: 257 is not from 1 to 256",
        );
        fails(
            oxcclCommInitRank(&mut comm, 2, id, 2),
            oxcclInvalidArgument,
            "rank: 2",
        );
        fails(
            oxcclCommInitRank(&mut comm, 2, id, -1),
            oxcclInvalidArgument,
            "rank: -1",
        );
        fails(
            oxcclCommInitRank(&mut comm, 2, id, 0),
            oxcclInvalidArgument,
            "commId",
        );
    }
    assert!(comm.is_null(), "nothing is written on failure");
}

#[test]
fn null_destroyed_and_foreign_handles_are_invalid_arguments() {
    let mut n = 0;
    let mut local = 0u64;
    let foreign: oxcclComm_t = (&raw mut local).cast();
    let comms = init_all(1);
    let stale = comms[0].0;
    destroy(comms);
    for (handle, words) in [
        (null_mut(), "comm is NULL"),
        (stale, "not a live communicator"),
        (foreign, "not a live communicator"),
    ] {
        // SAFETY: `n` is writable; the handle is the error under test and is not dereferenced.
        unsafe {
            fails(oxcclCommCount(handle, &mut n), oxcclInvalidArgument, words);
            fails(
                oxcclCommUserRank(handle, &mut n),
                oxcclInvalidArgument,
                words,
            );
            let mut x = [1.0f32; 4];
            let p = void_mut(&mut x);
            fails(
                oxcclAllReduce(p, p, 4, oxcclFloat32, oxcclSum, handle, null_mut()),
                oxcclInvalidArgument,
                words,
            );
        }
        fails(
            oxcclBarrier(handle, null_mut()),
            oxcclInvalidArgument,
            words,
        );
        fails(oxcclCommDestroy(handle), oxcclInvalidArgument, words);
        fails(oxcclCommAbort(handle), oxcclInvalidArgument, words);
    }
    assert_eq!(local, 0, "a foreign handle is never written through");
}

#[test]
fn counts_larger_than_any_buffer_are_refused_before_any_work() {
    // 2^61 bytes pass the size arithmetic, but no mapping of this process holds them: refused
    // at once (before the call cut them into slices), naming the buffer, on one rank alone.
    let comms = init_all(2);
    let c = comms[0].get();
    let mut small = vec![0f32; 64];
    let p = void_mut(&mut small);
    let huge = 1usize << 59; // floats: 2^61 bytes
    // SAFETY: the lengths are the errors under test; nothing is read or written.
    unsafe {
        fails(
            oxcclAllReduce(p, p, huge, oxcclFloat32, oxcclSum, c, null_mut()),
            oxcclInvalidArgument,
            "recvbuff: 2305843009213693952 bytes",
        );
        fails(
            oxcclBroadcast(p, p, huge, oxcclFloat32, 1, c, null_mut()),
            oxcclInvalidArgument,
            "are not all memory of this process",
        );
        fails(
            oxcclSend(p, huge * 4, oxcclInt8, 1, c, null_mut()),
            oxcclInvalidArgument,
            "sendbuff: 2305843009213693952 bytes",
        );
        fails(
            oxcclRecv(p, huge * 4, oxcclInt8, 1, c, null_mut()),
            oxcclInvalidArgument,
            "recvbuff: 2305843009213693952 bytes",
        );
        fails(
            oxcclAllGather(p, p, huge / 2, oxcclFloat32, c, null_mut()),
            oxcclInvalidArgument,
            "are not all memory of this process",
        );
    }
    // A real buffer past the bound (32 MiB) is taken, in place and not, and summed right.
    let n = 8 << 20;
    on_each(&comms, |r, c| {
        let send = vec![r as f32 + 1.0; n];
        let mut recv = vec![0f32; n];
        let mut both = vec![r as f32 + 1.0; n];
        // SAFETY: both buffers hold n floats.
        unsafe {
            ok(oxcclAllReduce(
                void(&send),
                void_mut(&mut recv),
                n,
                oxcclFloat32,
                oxcclSum,
                c,
                null_mut(),
            ));
            let p = void_mut(&mut both);
            ok(oxcclAllReduce(
                p,
                p,
                n,
                oxcclFloat32,
                oxcclSum,
                c,
                null_mut(),
            ));
        }
        assert!(recv.iter().chain(&both).all(|&x| x == 3.0), "rank {r}");
    });
    destroy(comms);
}

#[test]
fn bad_collective_arguments_are_invalid_arguments() {
    let comms = init_all(1);
    let c = comms[0].0;
    let mut a = [0f32; 8];
    let mut b = [0f32; 8];
    let (pa, pb) = (void_mut(&mut a), void_mut(&mut b));
    let s = null_mut();
    // SAFETY: the buffers hold 8 floats, more than any call here may touch; the arguments are
    // the errors under test.
    unsafe {
        fails(
            oxcclAllReduce(pa, pb, 4, 99, oxcclSum, c, s),
            oxcclInvalidArgument,
            "datatype: 99",
        );
        fails(
            oxcclAllReduce(pa, pb, 4, -1, oxcclSum, c, s),
            oxcclInvalidArgument,
            "datatype: -1",
        );
        fails(
            oxcclAllReduce(pa, pb, 4, oxcclFloat32, 99, c, s),
            oxcclInvalidArgument,
            "op: 99",
        );
        fails(
            oxcclAllReduce(pa, pb, 4, oxcclFloat32, 5, c, s),
            oxcclInvalidArgument,
            "op: 5",
        );
        fails(
            oxcclReduce(pa, pb, 4, oxcclFloat32, 99, 0, c, s),
            oxcclInvalidArgument,
            "op: 99",
        );
        fails(
            oxcclBroadcast(pa, pb, 4, oxcclFloat32, 1, c, s),
            oxcclInvalidArgument,
            "root: 1",
        );
        fails(
            oxcclBcast(pa, 4, oxcclFloat32, -1, c, s),
            oxcclInvalidArgument,
            "root: -1",
        );
        fails(
            oxcclReduce(pa, pb, 4, oxcclFloat32, 0, 7, c, s),
            oxcclInvalidArgument,
            "root: 7",
        );
        for dt in [oxcclFloat8e4m3, oxcclFloat8e5m2] {
            fails(
                oxcclAllReduce(pa, pb, 4, dt, oxcclBxor, c, s),
                oxcclInvalidArgument,
                "op: bxor is not defined on f8",
            );
        }
        let huge = usize::MAX / 2;
        fails(
            oxcclAllReduce(pa, pb, huge, oxcclFloat32, oxcclSum, c, s),
            oxcclInvalidArgument,
            "count",
        );
        fails(
            oxcclAllGather(pa, pb, usize::MAX, oxcclInt8, c, s),
            oxcclInvalidArgument,
            "sendcount",
        );
        fails(
            oxcclReduceScatter(pa, pb, usize::MAX, oxcclInt8, oxcclSum, c, s),
            oxcclInvalidArgument,
            "recvcount",
        );
        fails(
            oxcclAlltoAll(pa, pb, huge, oxcclFloat64, c, s),
            oxcclInvalidArgument,
            "count",
        );
        fails(
            oxcclAllReduce(null(), pb, 4, oxcclFloat32, oxcclSum, c, s),
            oxcclInvalidArgument,
            "sendbuff is NULL",
        );
        fails(
            oxcclAllReduce(pa, null_mut(), 4, oxcclFloat32, oxcclSum, c, s),
            oxcclInvalidArgument,
            "recvbuff is NULL",
        );
        // Overlapping, but not as the in-place form.
        let pa1 = a[1..].as_mut_ptr().cast::<c_void>();
        fails(
            oxcclAllReduce(pa, pa1, 4, oxcclFloat32, oxcclSum, c, s),
            oxcclInvalidArgument,
            "overlap",
        );
        // Bitwise operators are integer-only (the core library's check).
        fails(
            oxcclAllReduce(pa, pb, 4, oxcclFloat32, oxcclBxor, c, s),
            oxcclInvalidArgument,
            "bxor",
        );
        // Zero elements need no buffers.
        ok(oxcclAllReduce(
            null(),
            null_mut(),
            0,
            oxcclFloat32,
            oxcclSum,
            c,
            s,
        ));
    }
    destroy(comms);
}

#[test]
fn a_stream_with_host_memory_is_refused_naming_why() {
    // Rank 1 of 2: every call below fails before it talks to rank 0.
    let comms = init_all(2);
    let c = comms[1].0;
    let mut a = [0i32; 4];
    let p = void_mut(&mut a);
    let mut fake_stream = 0u8;
    let stream: oxcclStream_t = (&raw mut fake_stream).cast();
    // With a CUDA driver the buffer is found to be host memory; without one, the stream cannot
    // be used at all. Either way before the stream is touched.
    // Without one the message names the rank first (with one, see `device_memory`).
    let (code, words) = match oxccl_core::reduce::cuda::device_count() {
        Ok(_) => (oxcclInvalidArgument, "is not CUDA device memory"),
        Err(_) => (
            oxcclUnhandledCudaError,
            "rank 1: CUDA: a CUDA stream was given",
        ),
    };
    // SAFETY: the buffer holds 4 ints; the stream is the error under test and is never used.
    unsafe {
        fails(
            oxcclAllReduce(p, p, 4, oxcclInt32, oxcclSum, c, stream),
            code,
            words,
        );
        fails(
            oxcclBroadcast(p, p, 4, oxcclInt32, 0, c, stream),
            code,
            words,
        );
        fails(oxcclBcast(p, 4, oxcclInt32, 0, c, stream), code, words);
        fails(
            oxcclReduce(p, p, 4, oxcclInt32, 0, 0, c, stream),
            code,
            words,
        );
        fails(oxcclAllGather(p, p, 4, oxcclInt32, c, stream), code, words);
        fails(
            oxcclReduceScatter(p, p, 4, oxcclInt32, 0, c, stream),
            code,
            words,
        );
        fails(oxcclAlltoAll(p, p, 4, oxcclInt32, c, stream), code, words);
        // Sends and receives take device memory the same way; the barrier takes no stream.
        fails(oxcclSend(p, 4, oxcclInt32, 0, c, stream), code, words);
        fails(oxcclRecv(p, 4, oxcclInt32, 0, c, stream), code, words);
        let host_only = "CUDA streams are not supported yet: pass NULL for host memory";
        fails(oxcclBarrier(c, stream), oxcclInvalidUsage, host_only);
        // Inside a group the same checks hold when the call is made, and the group's end then
        // reports that a call inside it failed.
        assert_eq!(oxcclGroupStart(), oxcclSuccess);
        fails(
            oxcclAllReduce(p, p, 4, oxcclInt32, oxcclSum, c, stream),
            code,
            words,
        );
        fails(oxcclSend(p, 4, oxcclInt32, 0, c, stream), code, words);
        fails(oxcclGroupEnd(), code, "a call inside the group failed");
    }
    destroy(comms);
}

#[test]
fn the_last_error_is_per_thread_and_names_the_function() {
    fails(
        oxcclCommDestroy(null_mut()),
        oxcclInvalidArgument,
        "oxcclCommDestroy: comm is NULL",
    );
    let other = std::thread::spawn(last).join().unwrap();
    assert_eq!(other, "", "another thread has no error");
    assert!(last().contains("oxcclCommDestroy"));
}

#[test]
fn a_panic_becomes_an_internal_error() {
    let code = crate::boundary::guard("oxcclTest", || panic!("boom"));
    fails(code, oxcclInternalError, "oxcclTest: internal error");
    assert!(last().contains("boom"));
}

#[test]
fn count_and_rank_report_the_communicator() {
    let comms = init_all(3);
    for (r, c) in comms.iter().enumerate() {
        let (mut n, mut me) = (0, -1);
        // SAFETY: both are writable ints.
        unsafe {
            ok(oxcclCommCount(c.0, &mut n));
            ok(oxcclCommUserRank(c.0, &mut me));
        }
        assert_eq!((n, me), (3, r as c_int));
    }
    destroy(comms);
}

/// Every collective, out of place and in place, on `n` ranks, against values computed here.
fn every_collective(n: usize) {
    let comms = init_all(n);
    const K: usize = 5;
    let val = |r: usize, i: usize| (r * 100 + i) as i32;
    on_each(&comms, |r, c| {
        let s = null_mut();
        // SAFETY: every buffer below has the length the call's arguments say, and is only this
        // thread's.
        unsafe {
            // all-reduce: sum of i32, out of place; max of f64, in place; band extension.
            let send: Vec<i32> = (0..K).map(|i| val(r, i)).collect();
            let mut recv = vec![0i32; K];
            ok(oxcclAllReduce(
                void(&send),
                void_mut(&mut recv),
                K,
                oxcclInt32,
                oxcclSum,
                c,
                s,
            ));
            let want: Vec<i32> = (0..K).map(|i| (0..n).map(|q| val(q, i)).sum()).collect();
            assert_eq!(recv, want, "all-reduce sum, rank {r}");

            let mut buf: Vec<f64> = (0..K).map(|i| (r * i) as f64).collect();
            let p = void_mut(&mut buf);
            ok(oxcclAllReduce(p, p, K, oxcclFloat64, oxcclMax, c, s));
            let want: Vec<f64> = (0..K).map(|i| ((n - 1) * i) as f64).collect();
            assert_eq!(buf, want, "all-reduce max in place, rank {r}");

            let mut bits = vec![!(1u32 << r); K];
            let p = void_mut(&mut bits);
            ok(oxcclAllReduce(p, p, K, oxcclUint32, oxcclBand, c, s));
            let mask = (0..n).fold(u32::MAX, |m, q| m & !(1u32 << q));
            assert_eq!(bits, vec![mask; K], "all-reduce band, rank {r}");

            // broadcast from the last rank, out of place and in place (oxcclBcast).
            let root = n - 1;
            let send: Vec<i32> = (0..K).map(|i| val(r, i)).collect();
            let mut recv = vec![0i32; K];
            let root_c = root as c_int;
            ok(oxcclBroadcast(
                void(&send),
                void_mut(&mut recv),
                K,
                oxcclInt32,
                root_c,
                c,
                s,
            ));
            let want: Vec<i32> = (0..K).map(|i| val(root, i)).collect();
            assert_eq!(recv, want, "broadcast, rank {r}");
            let mut buf = send.clone();
            ok(oxcclBcast(void_mut(&mut buf), K, oxcclInt32, root_c, c, s));
            assert_eq!(buf, want, "bcast, rank {r}");

            // reduce to rank 0: product of i64 out of place, sum in place.
            let send: Vec<i64> = (0..K).map(|i| (r + i + 1) as i64).collect();
            let mut recv = vec![0i64; K];
            ok(oxcclReduce(
                void(&send),
                void_mut(&mut recv),
                K,
                oxcclInt64,
                oxcclProd,
                0,
                c,
                s,
            ));
            if r == 0 {
                let want: Vec<i64> = (0..K)
                    .map(|i| (0..n).map(|q| (q + i + 1) as i64).product())
                    .collect();
                assert_eq!(recv, want, "reduce prod at the root");
            } else {
                assert_eq!(recv, vec![0; K], "reduce leaves non-roots' recvbuff alone");
            }
            let mut buf = send.clone();
            let p = void_mut(&mut buf);
            ok(oxcclReduce(p, p, K, oxcclInt64, oxcclSum, 0, c, s));
            if r == 0 {
                let want: Vec<i64> = (0..K)
                    .map(|i| (0..n).map(|q| (q + i + 1) as i64).sum())
                    .collect();
                assert_eq!(buf, want, "reduce sum in place at the root");
            }

            // all-gather, out of place and in place (sendbuff = recvbuff + rank * block).
            let send: Vec<i32> = (0..K).map(|i| val(r, i)).collect();
            let mut recv = vec![0i32; n * K];
            ok(oxcclAllGather(
                void(&send),
                void_mut(&mut recv),
                K,
                oxcclInt32,
                c,
                s,
            ));
            let want: Vec<i32> = (0..n)
                .flat_map(|q| (0..K).map(move |i| val(q, i)))
                .collect();
            assert_eq!(recv, want, "all-gather, rank {r}");
            let mut buf = vec![-1i32; n * K];
            buf[r * K..(r + 1) * K].copy_from_slice(&send);
            let base = void_mut(&mut buf);
            let mine = base.cast::<i32>().add(r * K).cast::<c_void>();
            ok(oxcclAllGather(mine, base, K, oxcclInt32, c, s));
            assert_eq!(buf, want, "all-gather in place, rank {r}");

            // reduce-scatter, out of place and in place (recvbuff = sendbuff + rank * block).
            let send: Vec<f32> = (0..n * K).map(|j| (r * 1000 + j) as f32).collect();
            let mut recv = vec![0f32; K];
            let sum = oxcclSum;
            ok(oxcclReduceScatter(
                void(&send),
                void_mut(&mut recv),
                K,
                oxcclFloat32,
                sum,
                c,
                s,
            ));
            let want: Vec<f32> = (0..K)
                .map(|i| (0..n).map(|q| (q * 1000 + r * K + i) as f32).sum())
                .collect();
            assert_eq!(recv, want, "reduce-scatter, rank {r}");
            let mut buf = send.clone();
            let base = void_mut(&mut buf);
            let mine = base.cast::<f32>().add(r * K).cast::<c_void>();
            ok(oxcclReduceScatter(base, mine, K, oxcclFloat32, sum, c, s));
            assert_eq!(
                &buf[r * K..(r + 1) * K],
                &want[..],
                "reduce-scatter in place"
            );

            // all-to-all: block j of rank r goes to rank j's block r.
            let send: Vec<i32> = (0..n * K).map(|j| val(r, j)).collect();
            let mut recv = vec![0i32; n * K];
            ok(oxcclAlltoAll(
                void(&send),
                void_mut(&mut recv),
                K,
                oxcclInt32,
                c,
                s,
            ));
            let want: Vec<i32> = (0..n)
                .flat_map(|q| (0..K).map(move |i| val(q, r * K + i)))
                .collect();
            assert_eq!(recv, want, "all-to-all, rank {r}");
            let mut buf = send.clone();
            let p = void_mut(&mut buf);
            ok(oxcclAlltoAll(p, p, K, oxcclInt32, c, s));
            assert_eq!(buf, want, "all-to-all in place, rank {r}");
        }
        ok(oxcclBarrier(c, null_mut()));
    });
    destroy(comms);
}

#[test]
fn every_collective_on_one_rank() {
    every_collective(1);
}

#[test]
fn every_collective_on_two_ranks() {
    every_collective(2);
}

#[test]
fn every_collective_on_three_ranks() {
    every_collective(3);
}

#[test]
fn unique_id_and_init_rank_make_a_communicator() {
    let mut id = oxcclUniqueId { internal: [0; 128] };
    // SAFETY: `id` is writable.
    ok(unsafe { oxcclGetUniqueId(&mut id) });
    let n = 2;
    std::thread::scope(|s| {
        for r in 0..n {
            s.spawn(move || {
                let mut comm = null_mut();
                // SAFETY: `comm` is writable; `id` is passed by value.
                ok(unsafe { oxcclCommInitRank(&mut comm, n, id, r) });
                let mut x = [r + 1; 3];
                let p = void_mut(&mut x);
                // SAFETY: `x` holds 3 ints, only this thread's.
                ok(unsafe { oxcclAllReduce(p, p, 3, oxcclInt32, oxcclSum, comm, null_mut()) });
                assert_eq!(x, [3; 3]);
                ok(oxcclCommDestroy(comm));
            });
        }
    });
}

#[test]
fn abort_fails_the_peers_call_with_a_remote_error() {
    let comms = init_all(2);
    let waiting = comms[1];
    let call = std::thread::spawn(move || {
        let mut x = [1i32; 4];
        let p = void_mut(&mut x);
        // SAFETY: `x` holds 4 ints, only this thread's.
        let code =
            unsafe { oxcclAllReduce(p, p, 4, oxcclInt32, oxcclSum, waiting.get(), null_mut()) };
        (code, last())
    });
    std::thread::sleep(std::time::Duration::from_millis(200));
    ok(oxcclCommAbort(comms[0].0));
    let (code, msg) = call.join().unwrap();
    assert_eq!(code, oxcclRemoteError, "{msg}");
    assert!(msg.contains("rank 0"), "{msg}");
    ok(oxcclCommDestroy(comms[1].0));
}

mod extended;

/// Whether there is a CUDA device; without one, prints "skipped: ..." (a failure with
/// `OXCCL_REQUIRE_CUDA`).
fn device_or_skip() -> bool {
    let Err(e) = oxccl_core::reduce::cuda::device_count().and_then(|n| {
        (n > 0)
            .then_some(())
            .ok_or(oxccl_core::Error::Unavailable("no CUDA device".into()))
    }) else {
        return true;
    };
    assert!(
        std::env::var_os("OXCCL_REQUIRE_CUDA").is_none(),
        "OXCCL_REQUIRE_CUDA is set, but {e}"
    );
    println!("skipped: {e}");
    false
}

/// With a GPU: collectives on device memory through the stream argument, 3 ranks on threads on
/// device 0, against the values computed here; a rooted collective leaves the device memory it
/// ignores untouched. Without one: "skipped: ..." (a failure with `OXCCL_REQUIRE_CUDA`).
#[test]
fn collectives_on_device_memory_through_the_stream_argument() {
    use oxccl_core::reduce::cuda::cudarc::driver::{CudaContext, DevicePtr};
    if !device_or_skip() {
        return;
    }
    const N: usize = 999;
    let n = 3;
    let comms = init_all(n);
    on_each(&comms, |r, c| {
        let ctx = CudaContext::new(0).unwrap();
        let s = ctx.new_stream().unwrap();
        let stream: oxcclStream_t = s.cu_stream().cast();
        let mine: Vec<f32> = (0..n * N).map(|i| (i % 97) as f32 + r as f32).collect();
        let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let floats = |b: Vec<u8>| -> Vec<f32> {
            b.chunks(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect()
        };
        let sum = |i: usize| -> f32 { (0..n).map(|q| (i % 97) as f32 + q as f32).sum() };
        let send = s.clone_htod(&bytes(&mine)).unwrap();
        let recv = s.alloc_zeros::<u8>(n * N * 4).unwrap();
        {
            let (sp, _a) = send.device_ptr(&s);
            let (rp, _b) = recv.device_ptr(&s);
            let (sp, rp) = (sp as usize as *const c_void, rp as usize as *mut c_void);
            // SAFETY: device buffers of n × N floats, alive until the stream is synchronised
            // below; the stream is this thread's.
            unsafe {
                ok(oxcclAllReduce(
                    sp,
                    rp,
                    n * N,
                    oxcclFloat32,
                    oxcclSum,
                    c,
                    stream,
                ));
            }
        }
        let got = floats(s.clone_dtoh(&recv).unwrap());
        assert!((0..n * N).all(|i| got[i] == sum(i)), "rank {r}: all-reduce");

        // NCCL's default stream (NULL) with device buffers, as NCCL programs pass it: the
        // program had loaded libcuda when the communicators were made.
        let again = s.alloc_zeros::<u8>(n * N * 4).unwrap();
        s.synchronize().unwrap();
        {
            let (sp, _a) = send.device_ptr(&s);
            let (rp, _b) = again.device_ptr(&s);
            let (sp, rp) = (sp as usize as *const c_void, rp as usize as *mut c_void);
            // SAFETY: as above; the default stream is every context's.
            unsafe {
                ok(oxcclAllReduce(
                    sp,
                    rp,
                    n * N,
                    oxcclFloat32,
                    oxcclSum,
                    c,
                    null_mut(),
                ));
            }
        }
        ctx.synchronize().unwrap();
        let got = floats(s.clone_dtoh(&again).unwrap());
        assert!(
            (0..n * N).all(|i| got[i] == sum(i)),
            "rank {r}: all-reduce, default stream"
        );

        // In place reduce-scatter: rank r's block of the sums lands at block r of the buffer.
        let buf = s.clone_htod(&bytes(&mine)).unwrap();
        {
            let (bp, _a) = buf.device_ptr(&s);
            let whole = bp as usize as *mut c_void;
            let block = (bp as usize + r * N * 4) as *mut c_void;
            // SAFETY: as above; `block` lies inside `buf`, as in place defines it.
            unsafe {
                ok(oxcclReduceScatter(
                    whole,
                    block,
                    N,
                    oxcclFloat32,
                    oxcclSum,
                    c,
                    stream,
                ));
            }
        }
        let got = floats(s.clone_dtoh(&buf).unwrap());
        assert!(
            (0..N).all(|i| got[r * N + i] == sum(r * N + i)),
            "rank {r}: reduce-scatter in place"
        );

        // Reduce to rank 1: the others' receive buffer keeps its bytes.
        let kept = s.clone_htod(&vec![0x5au8; N * 4]).unwrap();
        {
            let (sp, _a) = send.device_ptr(&s);
            let (kp, _b) = kept.device_ptr(&s);
            let (sp, kp) = (sp as usize as *const c_void, kp as usize as *mut c_void);
            // SAFETY: as above.
            unsafe {
                ok(oxcclReduce(sp, kp, N, oxcclFloat32, oxcclMax, 1, c, stream));
            }
        }
        let got = s.clone_dtoh(&kept).unwrap();
        if r == 1 {
            let got = floats(got);
            let max = |i: usize| (i % 97) as f32 + (n - 1) as f32;
            assert!((0..N).all(|i| got[i] == max(i)), "rank {r}: reduce");
        } else {
            assert!(
                got.iter().all(|&b| b == 0x5a),
                "rank {r}: reduce touched a non-root"
            );
        }

        // Two in-place all-reduces on this communicator in one group (aggregated, as coalesced
        // calls are): both are made before either can run.
        let a = s.clone_htod(&bytes(&mine)).unwrap();
        let b = s.clone_htod(&bytes(&mine)).unwrap();
        {
            let (ap, _a) = a.device_ptr(&s);
            let (bp, _b) = b.device_ptr(&s);
            let (ap, bp) = (ap as usize as *mut c_void, bp as usize as *mut c_void);
            // SAFETY: as above.
            unsafe {
                assert_eq!(oxcclGroupStart(), oxcclSuccess);
                ok(oxcclAllReduce(
                    ap,
                    ap,
                    n * N,
                    oxcclFloat32,
                    oxcclSum,
                    c,
                    stream,
                ));
                ok(oxcclAllReduce(
                    bp,
                    bp,
                    n * N,
                    oxcclFloat32,
                    oxcclMax,
                    c,
                    stream,
                ));
                assert_eq!(oxcclGroupEnd(), oxcclSuccess);
            }
        }
        let got = floats(s.clone_dtoh(&a).unwrap());
        assert!(
            (0..n * N).all(|i| got[i] == sum(i)),
            "rank {r}: grouped sum"
        );
        let got = floats(s.clone_dtoh(&b).unwrap());
        let max = |i: usize| (i % 97) as f32 + (n - 1) as f32;
        assert!(
            (0..n * N).all(|i| got[i] == max(i)),
            "rank {r}: grouped max"
        );
    });
    destroy(comms);
}

/// The drop-in's `ncclMemAlloc` (NCCL 2.19+ programs such as nccl-tests take their buffers
/// from it): device memory once the program has loaded CUDA, usable as a collective's device
/// buffer, on a thread with a current context and on one without; host memory in a program
/// without CUDA. Either kind is freed once, and a second free is an error.
#[test]
fn nccl_mem_alloc_gives_device_memory_where_cuda_is_loaded() {
    use oxccl_core::reduce::cuda::cudarc::driver::{CudaContext, sys};
    let device = oxccl_core::reduce::cuda::device_count().is_ok_and(|n| n > 0);
    if !device {
        assert!(
            std::env::var_os("OXCCL_REQUIRE_CUDA").is_none(),
            "OXCCL_REQUIRE_CUDA is set, but there is no CUDA device"
        );
        // No CUDA in this process: host memory, as oxcclMemAlloc's.
        let mut p: *mut c_void = null_mut();
        // SAFETY: `p` is writable.
        ok(unsafe { nccl_mem_alloc(&mut p, 4096) });
        // SAFETY: 4096 bytes of host memory just allocated.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 7, 4096) };
        // SAFETY: allocated above, freed once.
        ok(unsafe { nccl_mem_free(p) });
        // SAFETY: as above; the second free is refused before anything is touched.
        fails(
            unsafe { nccl_mem_free(p) },
            oxcclInvalidArgument,
            "freed already",
        );
        println!("skipped (device half): no CUDA device");
        return;
    }
    const N: usize = 1000;
    let comms = init_all(2);
    on_each(&comms, |r, c| {
        let ctx = CudaContext::new(0).unwrap();
        let s = ctx.new_stream().unwrap();
        ctx.bind_to_thread().unwrap();
        let (mut send, mut recv): (*mut c_void, *mut c_void) = (null_mut(), null_mut());
        // SAFETY: writable out-parameters.
        unsafe {
            ok(nccl_mem_alloc(&mut send, N * 4));
            ok(nccl_mem_alloc(&mut recv, N * 4));
        }
        let mut kind: u32 = 0;
        // SAFETY: a writable unsigned int; any address may be asked about.
        let got = unsafe {
            sys::cuPointerGetAttribute(
                (&mut kind as *mut u32).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                send as sys::CUdeviceptr,
            )
        };
        assert_eq!(got, sys::CUresult::CUDA_SUCCESS, "rank {r}");
        assert_eq!(
            kind,
            sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32,
            "rank {r}: ncclMemAlloc gave no device memory"
        );
        let mine: Vec<f32> = (0..N).map(|i| (i * (r + 1)) as f32).collect();
        // SAFETY: `send` holds N floats of device memory; `mine` N floats on the host.
        let copied =
            unsafe { sys::cuMemcpyHtoD_v2(send as sys::CUdeviceptr, mine.as_ptr().cast(), N * 4) };
        assert_eq!(copied, sys::CUresult::CUDA_SUCCESS, "rank {r}");
        // SAFETY: device buffers of N floats, alive until the stream is synchronised below.
        ok(unsafe {
            oxcclAllReduce(
                send,
                recv,
                N,
                oxcclFloat32,
                oxcclSum,
                c,
                s.cu_stream().cast(),
            )
        });
        s.synchronize().unwrap();
        let mut got = vec![0f32; N];
        // SAFETY: as above, into N floats on the host.
        let copied = unsafe {
            sys::cuMemcpyDtoH_v2(got.as_mut_ptr().cast(), recv as sys::CUdeviceptr, N * 4)
        };
        assert_eq!(copied, sys::CUresult::CUDA_SUCCESS, "rank {r}");
        assert!(
            (0..N).all(|i| got[i] == (i * 3) as f32),
            "rank {r}: all-reduce of ncclMemAlloc buffers"
        );
        // SAFETY: allocated above, no longer used (the stream was synchronised); freed once.
        unsafe {
            ok(nccl_mem_free(send));
            ok(nccl_mem_free(recv));
        }
        // SAFETY: the second free is refused before anything is touched.
        fails(
            unsafe { nccl_mem_free(send) },
            oxcclInvalidArgument,
            "freed already",
        );
    });
    destroy(comms);
    // A thread with no current context gets device 0's primary context.
    std::thread::spawn(|| {
        let mut p: *mut c_void = null_mut();
        // SAFETY: `p` is writable.
        ok(unsafe { nccl_mem_alloc(&mut p, 64) });
        let mut ordinal: c_int = -1;
        // SAFETY: a writable int; any address may be asked about.
        let got = unsafe {
            sys::cuPointerGetAttribute(
                (&mut ordinal as *mut c_int).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                p as sys::CUdeviceptr,
            )
        };
        assert_eq!((got, ordinal), (sys::CUresult::CUDA_SUCCESS, 0));
        // SAFETY: allocated above, freed once.
        ok(unsafe { nccl_mem_free(p) });
    })
    .join()
    .unwrap();
}

/// With a GPU: sends and receives on device memory through the stream argument, alone (a pair
/// of ranks) and inside a group (an all-to-all of every rank with every rank, as nccl-tests'
/// alltoall_perf makes it, and an all-reduce in the same group); every received block against
/// the values computed here. Without one: "skipped: ..." (a failure with `OXCCL_REQUIRE_CUDA`).
#[test]
fn sends_and_receives_on_device_memory_alone_and_in_groups() {
    use oxccl_core::reduce::cuda::cudarc::driver::{CudaContext, DevicePtr};
    if !device_or_skip() {
        return;
    }
    const N: usize = 257;
    let n = 3;
    let comms = init_all(n);
    on_each(&comms, |r, c| {
        let ctx = CudaContext::new(0).unwrap();
        let s = ctx.new_stream().unwrap();
        let stream: oxcclStream_t = s.cu_stream().cast();
        let bytes = |v: &[i32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let ints = |b: Vec<u8>| -> Vec<i32> {
            b.chunks(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
                .collect()
        };
        // Block q of rank r's input: what r sends to q.
        let value = |from: usize, to: usize, i: usize| (from * 1000 + to * 100 + i) as i32;
        let mine: Vec<i32> = (0..n * N).map(|k| value(r, k / N, k % N)).collect();
        let send = s.clone_htod(&bytes(&mine)).unwrap();

        // Alone: ranks 0 and 1 exchange block 0 (0 sends first, 1 receives first).
        if r < 2 {
            let got = s.alloc_zeros::<u8>(N * 4).unwrap();
            {
                let (sp, _a) = send.device_ptr(&s);
                let (gp, _b) = got.device_ptr(&s);
                let (sp, gp) = (sp as usize as *const c_void, gp as usize as *mut c_void);
                let other = (1 - r) as c_int;
                // SAFETY: device buffers of N ints, alive until the stream is synchronised
                // below; the stream is this thread's.
                unsafe {
                    if r == 0 {
                        ok(oxcclSend(sp, N, oxcclInt32, other, c, stream));
                        ok(oxcclRecv(gp, N, oxcclInt32, other, c, stream));
                    } else {
                        ok(oxcclRecv(gp, N, oxcclInt32, other, c, stream));
                        ok(oxcclSend(sp, N, oxcclInt32, other, c, stream));
                    }
                }
            }
            let got = ints(s.clone_dtoh(&got).unwrap());
            let from = 1 - r;
            assert!(
                (0..N).all(|i| got[i] == value(from, 0, i)),
                "rank {r}: a send and receive alone"
            );
        }

        // In a group: every rank sends block q to rank q and receives q's block r into block q,
        // and all-reduces its input beside.
        let recv = s.alloc_zeros::<u8>(n * N * 4).unwrap();
        let sum = s.alloc_zeros::<u8>(n * N * 4).unwrap();
        {
            let (sp, _a) = send.device_ptr(&s);
            let (rp, _b) = recv.device_ptr(&s);
            let (up, _c) = sum.device_ptr(&s);
            let (sp, rp, up) = (sp as usize, rp as usize, up as usize);
            ok(oxcclGroupStart());
            for q in 0..n {
                // SAFETY: blocks of N ints inside the buffers above, alive until the stream is
                // synchronised below.
                unsafe {
                    ok(oxcclSend(
                        (sp + q * N * 4) as *const c_void,
                        N,
                        oxcclInt32,
                        q as c_int,
                        c,
                        stream,
                    ));
                    ok(oxcclRecv(
                        (rp + q * N * 4) as *mut c_void,
                        N,
                        oxcclInt32,
                        q as c_int,
                        c,
                        stream,
                    ));
                }
            }
            // SAFETY: as above, n × N ints each.
            ok(unsafe {
                oxcclAllReduce(
                    sp as *const c_void,
                    up as *mut c_void,
                    n * N,
                    oxcclInt32,
                    oxcclSum,
                    c,
                    stream,
                )
            });
            ok(oxcclGroupEnd());
        }
        let got = ints(s.clone_dtoh(&recv).unwrap());
        for q in 0..n {
            assert!(
                (0..N).all(|i| got[q * N + i] == value(q, r, i)),
                "rank {r}: block {q} of the grouped all-to-all"
            );
        }
        let got = ints(s.clone_dtoh(&sum).unwrap());
        assert!(
            (0..n * N).all(|k| got[k] == (0..n).map(|f| value(f, k / N, k % N)).sum::<i32>()),
            "rank {r}: the all-reduce in the group"
        );
    });
    destroy(comms);
}

/// `oxcclSendStart` / `oxcclRecvStart`: both ranks start their send first (4 MiB, more than
/// a link buffers), then their receive; `oxcclRequestTest` polls one until done and
/// `oxcclRequestWait` ends the other. Then what a caller can get wrong: NULL arguments, a
/// request used again after it ended, one inside a group, a destroyed communicator's.
#[test]
fn started_sends_and_receives_run_together_and_end_once() {
    const N: usize = 1 << 20; // i32s
    let comms = init_all(2);
    on_each(&comms, |r, c| {
        let peer = 1 - r as c_int;
        let mine: Vec<i32> = (0..N as i32)
            .map(|i| i.wrapping_mul(3) ^ r as i32)
            .collect();
        let mut got = vec![0i32; N];
        let (mut send, mut recv): (oxcclRequest_t, oxcclRequest_t) = (null_mut(), null_mut());
        // SAFETY: the buffers outlive the requests, which end below.
        unsafe {
            ok(oxcclSendStart(
                void(&mine),
                N,
                oxcclInt32,
                peer,
                7,
                c,
                &mut send,
            ));
            ok(oxcclRecvStart(
                void_mut(&mut got),
                N,
                oxcclInt32,
                peer,
                7,
                c,
                &mut recv,
            ));
            assert!(!send.is_null() && !recv.is_null() && send != recv);
            let mut done: c_int = 0;
            let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while done == 0 {
                assert!(
                    std::time::Instant::now() < until,
                    "rank {r}: the receive never ended"
                );
                ok(oxcclRequestTest(&mut recv, &mut done));
            }
            assert!(recv.is_null(), "a request that tested done is ended");
            ok(oxcclRequestWait(&mut send));
            assert!(send.is_null());
            // Ended requests: NULL handles are done at once.
            ok(oxcclRequestWait(&mut send));
            ok(oxcclRequestTest(&mut recv, &mut done));
            assert_eq!(done, 1);
        }
        let want = |i: usize| (i as i32).wrapping_mul(3) ^ peer;
        assert!((0..N).all(|i| got[i] == want(i)), "rank {r}: wrong data");
    });
    let c = comms[0].get();
    let buf = [0i32; 4];
    // SAFETY: NULL and stale handles are what the boundary must refuse without touching them.
    unsafe {
        fails(
            oxcclSendStart(void(&buf), 4, oxcclInt32, 1, 0, c, null_mut()),
            oxcclInvalidArgument,
            "request is NULL",
        );
        fails(
            oxcclRequestWait(null_mut()),
            oxcclInvalidArgument,
            "request is NULL",
        );
        let mut stale: oxcclRequest_t = std::ptr::without_provenance_mut(usize::MAX - 15);
        fails(
            oxcclRequestWait(&mut stale),
            oxcclInvalidArgument,
            "not a live request",
        );
        let mut done = 0;
        fails(
            oxcclRequestTest(&mut stale, null_mut()),
            oxcclInvalidArgument,
            "done is NULL",
        );
        fails(
            oxcclRequestTest(&mut stale, &mut done),
            oxcclInvalidArgument,
            "not a live request",
        );
        let mut req = null_mut();
        fails(
            oxcclSendStart(void(&buf), 4, oxcclInt32, 2, 0, c, &mut req),
            oxcclInvalidArgument,
            "peer",
        );
        ok(oxcclGroupStart());
        fails(
            oxcclSendStart(void(&buf), 4, oxcclInt32, 1, 0, c, &mut req),
            oxcclInvalidUsage,
            "cannot be part of a group",
        );
        ok(oxcclGroupEnd());
        assert!(req.is_null(), "a refused start writes no request");
    }
    // A request outstanding at destroy: destroy waits for it (here it fails: the peer's
    // communicator is gone first, or the receive has nothing to match), and the handle is
    // unknown afterwards.
    let mut got = [0i32; 4];
    let mut pending = null_mut();
    // SAFETY: `got` outlives the request: destroy waits for it.
    unsafe {
        ok(oxcclRecvStart(
            void_mut(&mut got),
            4,
            oxcclInt32,
            0,
            0,
            comms[1].get(),
            &mut pending,
        ))
    };
    ok(oxcclCommAbort(comms[0].get()));
    ok(oxcclCommDestroy(comms[1].get()));
    // SAFETY: a stale handle, refused without a dereference.
    fails(
        unsafe { oxcclRequestWait(&mut pending) },
        oxcclInvalidArgument,
        "not a live request",
    );
}

/// Started sends and receives carry a tag: a receive whose tag differs from the message it
/// meets fails with a mismatch naming both tags, and its memory keeps what it held.
#[test]
fn a_receive_with_another_tag_is_a_mismatch() {
    let comms = init_all(2);
    on_each(&comms, |r, c| {
        let mut req = null_mut();
        let mut buf = [9i32; 4];
        // SAFETY: the buffer outlives the request, which ends below.
        unsafe {
            if r == 0 {
                ok(oxcclSendStart(void(&buf), 4, oxcclInt32, 1, 3, c, &mut req));
                // Sent eagerly: whether it hears of the receiver's failure in time is a race.
                let _ = oxcclRequestWait(&mut req);
            } else {
                ok(oxcclRecvStart(
                    void_mut(&mut buf),
                    4,
                    oxcclInt32,
                    0,
                    4,
                    c,
                    &mut req,
                ));
                fails(oxcclRequestWait(&mut req), oxcclInvalidUsage, "with tag 4");
                let msg = last();
                assert!(msg.contains("send #0 of 16 B with tag 3"), "{msg}");
                assert_eq!(buf, [9; 4], "the receive wrote into its memory");
            }
        }
    });
    destroy(comms);
}

/// With a GPU: a pre-multiplied sum whose scalar is in device memory (`oxcclScalarDevice`, as
/// torch passes it) is read on the device, on the call's stream, after a kernel-side write of
/// it (a copy enqueued on the same stream just before); the same pointer with
/// `oxcclScalarHostImmediate` is refused; and a NULL-stream call whose send buffer is host
/// memory and receive buffer device memory is refused, not run on the host into the device
/// address. (Each crashed the program before: the scalar was read on the host.) Without a GPU:
/// "skipped: ...".
#[test]
fn a_device_scalar_is_read_on_the_stream_and_mixed_buffers_are_refused() {
    use oxccl_core::reduce::cuda::cudarc::driver::{CudaContext, DevicePtr};
    if !device_or_skip() {
        return;
    }
    let n = 2;
    let comms = init_all(n);
    on_each(&comms, |r, c| {
        let ctx = CudaContext::new(0).unwrap();
        let s = ctx.new_stream().unwrap();
        let stream: oxcclStream_t = s.cu_stream().cast();
        let mut k = s.alloc_zeros::<u8>(4).unwrap();
        let (kp, _g) = k.device_ptr(&s);
        let kp = kp as usize as *mut c_void;
        let mut op = -1;
        // SAFETY: `op` writable; `kp` device memory of one float, alive until the end.
        ok(unsafe { oxcclRedOpCreatePreMulSum(&mut op, kp, oxcclFloat32, oxcclScalarDevice, c) });
        let mut bad = -1;
        // SAFETY: as above.
        fails(
            unsafe {
                oxcclRedOpCreatePreMulSum(&mut bad, kp, oxcclFloat32, oxcclScalarHostImmediate, c)
            },
            oxcclInvalidArgument,
            "device memory",
        );
        drop(_g);
        // The scalar becomes 0.5 on the stream, right before the call.
        s.memcpy_htod(&0.5f32.to_le_bytes(), &mut k).unwrap();
        let x: Vec<f32> = (0..10).map(|i| (r + i) as f32).collect();
        let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        let send = s.clone_htod(&bytes).unwrap();
        let recv = s.alloc_zeros::<u8>(40).unwrap();
        {
            let (sp, _a) = send.device_ptr(&s);
            let (rp, _b) = recv.device_ptr(&s);
            // SAFETY: device buffers of 10 floats, alive until the stream is synchronised
            // below; the stream is this thread's.
            ok(unsafe {
                oxcclAllReduce(
                    sp as usize as *const c_void,
                    rp as usize as *mut c_void,
                    10,
                    oxcclFloat32,
                    op,
                    c,
                    stream,
                )
            });
        }
        let got: Vec<f32> = s
            .clone_dtoh(&recv)
            .unwrap()
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let want: Vec<f32> = (0..10)
            .map(|i| (0..n).map(|q| 0.5 * (q + i) as f32).sum())
            .collect();
        assert_eq!(got, want, "rank {r}");

        s.synchronize().unwrap();
        let (rp, _b) = recv.device_ptr(&s);
        // SAFETY: host send of 10 floats, device receive of as many.
        fails(
            unsafe {
                oxcclAllReduce(
                    void(&x),
                    rp as usize as *mut c_void,
                    10,
                    oxcclFloat32,
                    oxcclSum,
                    c,
                    null_mut(),
                )
            },
            oxcclInvalidArgument,
            "is not CUDA device memory",
        );
    });
}
