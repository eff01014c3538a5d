//! Groups, point-to-point, gather and scatter, split, non-blocking communicators,
//! pre-multiplied sums and the memory calls, each checked against values computed here.

use std::ffi::{c_int, c_void};
use std::ptr::{null, null_mut};
use std::time::{Duration, Instant};

use super::{Comm, destroy, fails, init_all, last, ok, on_each, void, void_mut};
use crate::*;

fn unique_id() -> oxcclUniqueId {
    let mut id = oxcclUniqueId { internal: [0; 128] };
    // SAFETY: `id` is writable.
    ok(unsafe { oxcclGetUniqueId(&mut id) });
    id
}

fn config(blocking: c_int) -> oxcclConfig_t {
    oxcclConfig_t {
        size: std::mem::size_of::<oxcclConfig_t>(),
        magic: OXCCL_CONFIG_MAGIC,
        version: OXCCL_CONFIG_VERSION,
        blocking,
        cgaClusterSize: OXCCL_CONFIG_UNDEF_INT,
        minCTAs: OXCCL_CONFIG_UNDEF_INT,
        maxCTAs: OXCCL_CONFIG_UNDEF_INT,
        netName: null(),
        splitShare: OXCCL_CONFIG_UNDEF_INT,
        trafficClass: OXCCL_CONFIG_UNDEF_INT,
        commName: null(),
        collnetEnable: OXCCL_CONFIG_UNDEF_INT,
        CTAPolicy: OXCCL_CONFIG_UNDEF_INT,
        shrinkShare: OXCCL_CONFIG_UNDEF_INT,
        nvlsCTAs: OXCCL_CONFIG_UNDEF_INT,
    }
}

/// Polls `comm` until it is no longer in progress (within 20 s) and returns its state.
fn settle(comm: oxcclComm_t) -> oxcclResult_t {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let mut state = oxcclInProgress;
        // SAFETY: `state` is writable.
        ok(unsafe { oxcclCommGetAsyncError(comm, &mut state) });
        if state != oxcclInProgress {
            return state;
        }
        assert!(Instant::now() < end, "comm still in progress after 20 s");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn one_thread_drives_every_rank_inside_a_group() {
    let n = 3;
    let comms = init_all(n);
    let mut bufs: Vec<Vec<f64>> = (0..n).map(|r| vec![r as f64 + 1.0; 1000]).collect();
    ok(oxcclGroupStart());
    ok(oxcclGroupStart()); // nested: only the outermost end runs the group
    for (r, b) in bufs.iter_mut().enumerate() {
        let p = void_mut(b);
        // SAFETY: `b` holds 1000 doubles and is not touched until oxcclGroupEnd returns.
        ok(unsafe {
            oxcclAllReduce(
                p,
                p,
                1000,
                oxcclFloat64,
                oxcclSum,
                comms[r].get(),
                null_mut(),
            )
        });
    }
    ok(oxcclGroupEnd());
    for (r, b) in bufs.iter().enumerate() {
        assert_eq!(b[0], r as f64 + 1.0, "the inner end ran the group");
    }
    ok(oxcclGroupEnd());
    for b in &bufs {
        assert!(b.iter().all(|&x| x == 6.0), "{:?}", &b[..4]);
    }
    fails(
        oxcclGroupEnd(),
        oxcclInvalidUsage,
        "without oxcclGroupStart",
    );
    destroy(comms);
}

#[test]
fn a_group_creates_every_rank_from_one_thread() {
    let id = unique_id();
    let n = 3;
    let mut comms = vec![null_mut(); n];
    ok(oxcclGroupStart());
    for (r, c) in comms.iter_mut().enumerate() {
        // SAFETY: `c` stays writable until oxcclGroupEnd.
        ok(unsafe { oxcclCommInitRank(c, n as c_int, id, r as c_int) });
    }
    ok(oxcclGroupEnd());
    for (r, &c) in comms.iter().enumerate() {
        let mut rank = -1;
        // SAFETY: `rank` is writable.
        ok(unsafe { oxcclCommUserRank(c, &mut rank) });
        assert_eq!(rank, r as c_int);
    }
    destroy(comms.into_iter().map(Comm).collect());
}

#[test]
fn a_failed_call_inside_a_group_runs_nothing() {
    let comms = init_all(2);
    let mut a = [1.0f32; 4];
    let mut b = [2.0f32; 4];
    ok(oxcclGroupStart());
    let (pa, pb) = (void_mut(&mut a), void_mut(&mut b));
    // SAFETY: the buffers hold 4 floats each, untouched until oxcclGroupEnd.
    unsafe {
        ok(oxcclAllReduce(
            pa,
            pa,
            4,
            oxcclFloat32,
            oxcclSum,
            comms[0].get(),
            null_mut(),
        ));
        fails(
            oxcclAllReduce(pb, pb, 4, 99, oxcclSum, comms[1].get(), null_mut()),
            oxcclInvalidArgument,
            "datatype",
        );
    }
    fails(
        oxcclGroupEnd(),
        oxcclInvalidArgument,
        "none of the group's work ran",
    );
    assert_eq!((a, b), ([1.0; 4], [2.0; 4]));
    destroy(comms);
}

/// A communicator destroyed (or aborted) inside a group that kept operations on it: the group
/// runs none of its work, so nothing writes the caller's buffers after the destroy returned.
#[test]
fn a_comm_destroyed_inside_a_group_runs_none_of_its_work() {
    for abort in [false, true] {
        let comms = init_all(2);
        let mut bufs = [[1.0f32; 4], [2.0f32; 4]];
        ok(oxcclGroupStart());
        for (c, b) in comms.iter().zip(bufs.iter_mut()) {
            let p = void_mut(b);
            // SAFETY: the buffer holds 4 floats, untouched until oxcclGroupEnd.
            ok(unsafe { oxcclAllReduce(p, p, 4, oxcclFloat32, oxcclSum, c.get(), null_mut()) });
        }
        for c in &comms {
            ok(if abort {
                oxcclCommAbort(c.get())
            } else {
                oxcclCommDestroy(c.get())
            });
        }
        let how = if abort { "aborted" } else { "destroyed" };
        fails(
            oxcclGroupEnd(),
            oxcclInvalidUsage,
            &format!("comm was {how} inside the group"),
        );
        assert_eq!(bufs, [[1.0; 4], [2.0; 4]], "{how}");
    }
}

/// A call that a group does not keep (a query, here with a NULL out-pointer) fails on its own,
/// as in NCCL: the group's kept work still runs at `oxcclGroupEnd`.
#[test]
fn a_failed_query_inside_a_group_leaves_the_group_alone() {
    let comms = init_all(2);
    let mut bufs = [[1.0f32; 4], [2.0f32; 4]];
    ok(oxcclGroupStart());
    for (r, b) in bufs.iter_mut().enumerate() {
        let p = void_mut(b);
        // SAFETY: the buffer holds 4 floats, untouched until oxcclGroupEnd.
        ok(unsafe { oxcclAllReduce(p, p, 4, oxcclFloat32, oxcclSum, comms[r].get(), null_mut()) });
    }
    // SAFETY: NULL is the error under test.
    fails(
        unsafe { oxcclCommCount(comms[0].get(), null_mut()) },
        oxcclInvalidArgument,
        "count",
    );
    ok(oxcclGroupEnd());
    assert_eq!(bufs, [[3.0; 4], [3.0; 4]]);
    destroy(comms);
}

#[test]
fn sends_and_receives_shift_a_ring_in_one_group() {
    let n = 4;
    let comms = init_all(n);
    // From one thread: every rank sends to the next and receives from the previous.
    let send: Vec<Vec<i64>> = (0..n)
        .map(|r| (0..100).map(|i| (r * 1000 + i) as i64).collect())
        .collect();
    let mut recv = vec![vec![0i64; 100]; n];
    ok(oxcclGroupStart());
    for r in 0..n {
        let c = comms[r].get();
        // SAFETY: the buffers hold 100 int64 each and stay untouched until oxcclGroupEnd.
        unsafe {
            ok(oxcclSend(
                void(&send[r]),
                100,
                oxcclInt64,
                ((r + 1) % n) as c_int,
                c,
                null_mut(),
            ));
            ok(oxcclRecv(
                void_mut(&mut recv[r]),
                100,
                oxcclInt64,
                ((r + n - 1) % n) as c_int,
                c,
                null_mut(),
            ));
        }
    }
    ok(oxcclGroupEnd());
    for r in 0..n {
        assert_eq!(recv[r], send[(r + n - 1) % n], "rank {r}");
    }
    // One thread per rank, a group each, and a message to oneself.
    on_each(&comms, |r, c| {
        let mine = [r as i32 * 7; 5];
        let mut back = [0i32; 5];
        let mut from_next = [0i32; 5];
        ok(oxcclGroupStart());
        // SAFETY: the buffers hold 5 ints each, untouched until oxcclGroupEnd.
        unsafe {
            ok(oxcclSend(
                void(&mine),
                5,
                oxcclInt32,
                r as c_int,
                c,
                null_mut(),
            ));
            ok(oxcclRecv(
                void_mut(&mut back),
                5,
                oxcclInt32,
                r as c_int,
                c,
                null_mut(),
            ));
            ok(oxcclSend(
                void(&mine),
                5,
                oxcclInt32,
                ((r + n - 1) % n) as c_int,
                c,
                null_mut(),
            ));
            ok(oxcclRecv(
                void_mut(&mut from_next),
                5,
                oxcclInt32,
                ((r + 1) % n) as c_int,
                c,
                null_mut(),
            ));
        }
        ok(oxcclGroupEnd());
        assert_eq!(back, mine);
        assert_eq!(from_next, [((r + 1) % n) as i32 * 7; 5]);
    });
    // A lone send and receive, from two threads.
    let pair = [comms[0], comms[1]];
    std::thread::scope(|s| {
        s.spawn(|| {
            let x = [3.5f32; 8];
            // SAFETY: `x` holds 8 floats.
            ok(unsafe { oxcclSend(void(&x), 8, oxcclFloat32, 1, pair[0].get(), null_mut()) });
        });
        s.spawn(|| {
            let mut y = [0f32; 8];
            // SAFETY: `y` holds 8 floats.
            ok(unsafe {
                oxcclRecv(
                    void_mut(&mut y),
                    8,
                    oxcclFloat32,
                    0,
                    pair[1].get(),
                    null_mut(),
                )
            });
            assert_eq!(y, [3.5; 8]);
        });
    });
    let x = [0u8; 4];
    // SAFETY: `x` holds 4 bytes.
    fails(
        unsafe {
            oxcclSend(
                void(&x),
                4,
                oxcclUint8,
                n as c_int,
                comms[0].get(),
                null_mut(),
            )
        },
        oxcclInvalidArgument,
        "peer",
    );
    destroy(comms);
}

#[test]
fn gather_and_scatter_out_of_place_and_in_place() {
    let n = 3;
    let comms = init_all(n);
    let k = 7;
    for root in 0..n {
        on_each(&comms, |r, c| {
            let mine: Vec<u32> = (0..k).map(|i| (r * 100 + i) as u32).collect();
            let want: Vec<u32> = (0..n)
                .flat_map(|q| (0..k).map(move |i| (q * 100 + i) as u32))
                .collect();
            // Out of place; other ranks pass NULL for the root's buffer.
            let mut all = vec![0u32; n * k];
            let dst = if r == root {
                void_mut(&mut all)
            } else {
                null_mut()
            };
            // SAFETY: `mine` holds k elements, `all` n·k (at the root).
            ok(unsafe {
                oxcclGather(
                    void(&mine),
                    dst,
                    k,
                    oxcclUint32,
                    root as c_int,
                    c,
                    null_mut(),
                )
            });
            if r == root {
                assert_eq!(all, want, "gather to {root}");
            }
            // In place at the root.
            let mut buf = vec![0u32; n * k];
            buf[r * k..(r + 1) * k].copy_from_slice(&mine);
            let p = void_mut(&mut buf);
            let send = if r == root {
                // SAFETY: block r of buf.
                unsafe { p.cast::<u32>().add(r * k).cast::<c_void>() }
            } else {
                void(&mine)
            };
            // SAFETY: as above.
            ok(unsafe { oxcclGather(send, p, k, oxcclUint32, root as c_int, c, null_mut()) });
            if r == root {
                assert_eq!(buf, want, "in-place gather to {root}");
            }
            // Scatter back: rank q gets block q of the root's buffer.
            let mut got = vec![0u32; k];
            let src = if r == root { void(&want) } else { null() };
            // SAFETY: `want` holds n·k elements, `got` k.
            ok(unsafe {
                oxcclScatter(
                    src,
                    void_mut(&mut got),
                    k,
                    oxcclUint32,
                    root as c_int,
                    c,
                    null_mut(),
                )
            });
            assert_eq!(got, mine, "scatter from {root}");
            // In place at the root.
            let mut whole = want.clone();
            let pw = void_mut(&mut whole);
            let mut got2 = vec![0u32; k];
            let recv = if r == root {
                // SAFETY: block r of whole.
                unsafe { pw.cast::<u32>().add(r * k).cast::<c_void>() }
            } else {
                void_mut(&mut got2)
            };
            // SAFETY: as above.
            ok(unsafe { oxcclScatter(pw, recv, k, oxcclUint32, root as c_int, c, null_mut()) });
            let out = if r == root {
                whole[r * k..(r + 1) * k].to_vec()
            } else {
                got2
            };
            assert_eq!(out, mine, "in-place scatter from {root}");
        });
    }
    destroy(comms);
}

#[test]
fn split_by_color_orders_by_key_and_nocolor_gets_null() {
    let n = 4;
    let comms = init_all(n);
    on_each(&comms, |r, c| {
        // Ranks 0 and 2 form one (key reverses the order), 1 joins none, 3 is alone.
        let color = match r {
            0 | 2 => 5,
            1 => OXCCL_SPLIT_NOCOLOR,
            _ => 9,
        };
        let key = -(r as c_int);
        let mut child = null_mut();
        // SAFETY: `child` is writable; config NULL.
        ok(unsafe { oxcclCommSplit(c, color, key, &mut child, null_mut()) });
        if r == 1 {
            assert!(child.is_null());
            return;
        }
        let (mut rank, mut count) = (-1, -1);
        // SAFETY: both writable.
        unsafe {
            ok(oxcclCommUserRank(child, &mut rank));
            ok(oxcclCommCount(child, &mut count));
        }
        let (want_rank, want_count) = match r {
            0 => (1, 2),
            2 => (0, 2),
            _ => (0, 1),
        };
        assert_eq!((rank, count), (want_rank, want_count), "rank {r}");
        let mut x = [r as i32; 2];
        let p = void_mut(&mut x);
        // SAFETY: `x` holds 2 ints.
        ok(unsafe { oxcclAllReduce(p, p, 2, oxcclInt32, oxcclSum, child, null_mut()) });
        let want = if r == 3 { 3 } else { 2 };
        assert_eq!(x, [want; 2]);
        ok(oxcclCommDestroy(child));
    });
    let mut child = null_mut();
    // SAFETY: `child` is writable.
    fails(
        unsafe { oxcclCommSplit(comms[0].get(), -2, 0, &mut child, null_mut()) },
        oxcclInvalidArgument,
        "color",
    );
    destroy(comms);
}

#[test]
fn a_non_blocking_communicator_reports_progress_through_get_async_error() {
    let id = unique_id();
    let n = 2;
    std::thread::scope(|s| {
        for r in 0..n {
            s.spawn(move || {
                let mut cfg = config(0);
                let mut comm = null_mut();
                // SAFETY: `comm` and `cfg` are valid.
                let code = unsafe { oxcclCommInitRankConfig(&mut comm, n, id, r, &mut cfg) };
                assert_eq!(code, oxcclInProgress, "{}", last());
                assert!(!comm.is_null());
                assert_eq!(settle(comm), oxcclSuccess, "{}", last());
                let mut x = vec![r as f32 + 1.0; 100_000];
                let p = void_mut(&mut x);
                // SAFETY: `x` holds 100000 floats, untouched until the comm settles.
                let code = unsafe {
                    oxcclAllReduce(p, p, 100_000, oxcclFloat32, oxcclSum, comm, null_mut())
                };
                assert_eq!(code, oxcclInProgress, "{}", last());
                assert_eq!(settle(comm), oxcclSuccess);
                assert!(x.iter().all(|&v| v == 3.0));
                // Two in flight, then finalize.
                let mut y = [r as i64; 3];
                let mut z = [10 * r as i64; 3];
                let (py, pz) = (void_mut(&mut y), void_mut(&mut z));
                // SAFETY: `y` and `z` hold 3 int64, untouched until finalize completes.
                unsafe {
                    assert_eq!(
                        oxcclAllReduce(py, py, 3, oxcclInt64, oxcclMax, comm, null_mut()),
                        oxcclInProgress
                    );
                    assert_eq!(
                        oxcclAllReduce(pz, pz, 3, oxcclInt64, oxcclSum, comm, null_mut()),
                        oxcclInProgress
                    );
                }
                let code = oxcclCommFinalize(comm);
                assert!(
                    code == oxcclSuccess || code == oxcclInProgress,
                    "{code}: {}",
                    last()
                );
                assert_eq!(settle(comm), oxcclSuccess);
                assert_eq!((y, z), ([1; 3], [10; 3]));
                // SAFETY: as above.
                fails(
                    unsafe { oxcclAllReduce(py, py, 3, oxcclInt64, oxcclMax, comm, null_mut()) },
                    oxcclInvalidUsage,
                    "finalized",
                );
                ok(oxcclCommDestroy(comm));
            });
        }
    });
}

#[test]
fn configs_are_checked_as_nccl_checks_them() {
    let id = unique_id();
    let mut comm = null_mut();
    let mut bad = config(1);
    bad.magic = 0x1234;
    // SAFETY: `comm` and `bad` are valid.
    fails(
        unsafe { oxcclCommInitRankConfig(&mut comm, 1, id, 0, &mut bad) },
        oxcclInvalidArgument,
        "magic",
    );
    let mut bad = config(1);
    bad.size = 8;
    // SAFETY: as above.
    fails(
        unsafe { oxcclCommInitRankConfig(&mut comm, 1, id, 0, &mut bad) },
        oxcclInvalidArgument,
        "size",
    );
    let mut bad = config(2);
    // SAFETY: as above.
    fails(
        unsafe { oxcclCommInitRankConfig(&mut comm, 1, id, 0, &mut bad) },
        oxcclInvalidArgument,
        "blocking",
    );
    let mut bad = config(1);
    bad.version = 100;
    // SAFETY: as above.
    fails(
        unsafe { oxcclCommInitRankConfig(&mut comm, 1, id, 0, &mut bad) },
        oxcclInvalidArgument,
        "version",
    );
    // An older caller's smaller struct: the fields past its size are undefined (blocking 0 is
    // inside it and is used).
    let mut old = config(0);
    old.size = std::mem::offset_of!(oxcclConfig_t, netName);
    old.nvlsCTAs = 12345; // past the size: must not be read as anything
    // SAFETY: as above.
    let code = unsafe { oxcclCommInitRankConfig(&mut comm, 1, id, 0, &mut old) };
    assert_eq!(code, oxcclInProgress, "{}", last());
    assert_eq!(settle(comm), oxcclSuccess);
    let mut dev = 0;
    // SAFETY: `dev` is writable.
    ok(unsafe { oxcclCommCuDevice(comm, &mut dev) });
    assert_eq!(dev, -1);
    ok(oxcclCommDestroy(comm));
    // Scalable: two ids, the first is used.
    let mut ids = [unique_id(), unique_id()];
    let mut comm = null_mut();
    // SAFETY: `ids` holds 2 ids.
    fails(
        unsafe { oxcclCommInitRankScalable(&mut comm, 1, 0, 3, ids.as_mut_ptr(), null_mut()) },
        oxcclInvalidArgument,
        "nId",
    );
    std::thread::scope(|s| {
        for r in 0..2 {
            let mut ids = ids;
            s.spawn(move || {
                let mut comm = null_mut();
                // SAFETY: `ids` holds 2 ids.
                ok(unsafe {
                    oxcclCommInitRankScalable(&mut comm, 2, r, 2, ids.as_mut_ptr(), null_mut())
                });
                let mut x = [1u8; 1];
                let p = void_mut(&mut x);
                // SAFETY: `x` holds 1 byte.
                ok(unsafe { oxcclAllReduce(p, p, 1, oxcclUint8, oxcclSum, comm, null_mut()) });
                assert_eq!(x, [2]);
                ok(oxcclCommDestroy(comm));
            });
        }
    });
}

#[test]
fn pre_multiplied_sums_scale_each_input_before_summing() {
    let n = 3;
    let comms = init_all(n);
    on_each(&comms, |r, c| {
        // f32, scalar copied at creation: sum of 0.5 · (r + i).
        let mut half = 0.5f32;
        let mut op = -1;
        // SAFETY: `op` is writable, `half` readable.
        ok(unsafe {
            oxcclRedOpCreatePreMulSum(
                &mut op,
                (&raw mut half).cast(),
                oxcclFloat32,
                oxcclScalarHostImmediate,
                c,
            )
        });
        assert!((oxcclNumOps..oxcclBand).contains(&op), "{op}");
        half = 100.0; // copied already: no effect
        let x: Vec<f32> = (0..10).map(|i| (r + i) as f32).collect();
        let mut y = vec![0f32; 10];
        // SAFETY: 10 floats each.
        ok(unsafe {
            oxcclAllReduce(
                void(&x),
                void_mut(&mut y),
                10,
                oxcclFloat32,
                op,
                c,
                null_mut(),
            )
        });
        let want: Vec<f32> = (0..10)
            .map(|i| (0..n).map(|q| 0.5 * (q + i) as f32).sum())
            .collect();
        assert_eq!(y, want);
        let _ = half;
        // The wrong type is refused; so is the operator once destroyed.
        let mut d = [1.0f64; 2];
        let pd = void_mut(&mut d);
        // SAFETY: 2 doubles.
        fails(
            unsafe { oxcclAllReduce(pd, pd, 2, oxcclFloat64, op, c, null_mut()) },
            oxcclInvalidArgument,
            "made for",
        );
        ok(oxcclRedOpDestroy(op, c));
        fails(oxcclRedOpDestroy(op, c), oxcclInvalidArgument, "op");
        // int32, scalar read through its pointer at each call, in place, and reduce-scatter.
        let mut k = 3i32;
        let mut op = -1;
        // SAFETY: `op` writable; `k` stays readable until the destroy below.
        ok(unsafe {
            oxcclRedOpCreatePreMulSum(
                &mut op,
                (&raw mut k).cast(),
                oxcclInt32,
                oxcclScalarDevice,
                c,
            )
        });
        let mut v = [r as i32 + 1; 4];
        let pv = void_mut(&mut v);
        // SAFETY: 4 ints.
        ok(unsafe { oxcclAllReduce(pv, pv, 4, oxcclInt32, op, c, null_mut()) });
        assert_eq!(v, [3 * 6; 4]);
        // Every rank's send: element j is j; block r of the scaled sum is 3·n·j.
        let mut all: Vec<i32> = (0..(2 * n) as i32).collect();
        let pa = void_mut(&mut all);
        // SAFETY: in place: recvbuff is block r of the 2n ints.
        let recv = unsafe { pa.cast::<i32>().add(2 * r).cast::<c_void>() };
        // SAFETY: as above.
        ok(unsafe { oxcclReduceScatter(pa, recv, 2, oxcclInt32, op, c, null_mut()) });
        let want: Vec<i32> = (0..2).map(|j| 3 * n as i32 * (2 * r as i32 + j)).collect();
        assert_eq!(&all[2 * r..2 * r + 2], &want[..]);
        ok(oxcclRedOpDestroy(op, c));
        let _ = &mut k;
        // Bad residence.
        let mut op = -1;
        // SAFETY: as above.
        fails(
            unsafe { oxcclRedOpCreatePreMulSum(&mut op, (&raw mut k).cast(), oxcclInt32, 7, c) },
            oxcclInvalidArgument,
            "residence",
        );
    });
    destroy(comms);
}

#[test]
fn memory_and_registrations_are_checked() {
    let comms = init_all(1);
    let c = comms[0].get();
    let mut p = null_mut();
    // SAFETY: `p` is writable.
    ok(unsafe { oxcclMemAlloc(&mut p, 1 << 20) });
    assert!(!p.is_null() && (p as usize).is_multiple_of(4096));
    // The memory works as a buffer.
    // SAFETY: 1 MiB of our allocation.
    let buf = unsafe { std::slice::from_raw_parts_mut(p.cast::<f32>(), 1 << 18) };
    buf.fill(2.0);
    // SAFETY: 2^18 floats.
    ok(unsafe { oxcclAllReduce(p, p, 1 << 18, oxcclFloat32, oxcclProd, c, null_mut()) });
    assert!(buf.iter().all(|&x| x == 2.0));
    let mut handle = null_mut();
    // SAFETY: `handle` is writable.
    ok(unsafe { oxcclCommRegister(c, p, 1 << 20, &mut handle) });
    ok(oxcclCommDeregister(c, handle));
    fails(
        oxcclCommDeregister(c, handle),
        oxcclInvalidArgument,
        "handle",
    );
    let mut win = null_mut();
    // SAFETY: `win` is writable.
    ok(unsafe { oxcclCommWindowRegister(c, p, 1 << 20, &mut win, OXCCL_WIN_COLL_SYMMETRIC) });
    fails(
        // SAFETY: `win` is writable.
        unsafe { oxcclCommWindowRegister(c, p, 16, &mut win, 4) },
        oxcclInvalidArgument,
        "winFlags",
    );
    ok(oxcclCommWindowDeregister(c, win));
    // A size larger than the memory mapped there is refused (it would be pinned over rdma):
    // 1 TiB at our 1 MiB, 1 GiB beyond it (what lies just past an allocation may be mapped
    // for other uses, which no check can tell from the buffer).
    for size in [1usize << 40, (1 << 20) + (1 << 30)] {
        let mut h = null_mut();
        // SAFETY: `h` is writable; the registration is refused before it reads anything.
        fails(
            unsafe { oxcclCommRegister(c, p, size, &mut h) },
            oxcclInvalidArgument,
            "are not all memory of this process",
        );
        let mut w = null_mut();
        // SAFETY: as above.
        fails(
            unsafe { oxcclCommWindowRegister(c, p, size, &mut w, OXCCL_WIN_COLL_SYMMETRIC) },
            oxcclInvalidArgument,
            "are not all memory of this process",
        );
    }
    // SAFETY: nothing uses `p` any more; the other frees are refused before touching memory.
    unsafe {
        ok(oxcclMemFree(p));
        fails(oxcclMemFree(p), oxcclInvalidArgument, "oxcclMemAlloc");
        let mut local = 0u8;
        fails(
            oxcclMemFree((&raw mut local).cast()),
            oxcclInvalidArgument,
            "oxcclMemAlloc",
        );
        ok(oxcclMemFree(null_mut()));
    }
    // SAFETY: `p` is writable.
    fails(
        unsafe { oxcclMemAlloc(&mut p, 0) },
        oxcclInvalidArgument,
        "size",
    );
    destroy(comms);
}

#[test]
fn a_blocking_communicator_reports_a_peers_failure_through_get_async_error() {
    let comms = init_all(2);
    let survivor = comms[1];
    let call = std::thread::spawn(move || {
        let mut x = [1i32; 4];
        let p = void_mut(&mut x);
        // SAFETY: 4 ints.
        unsafe { oxcclAllReduce(p, p, 4, oxcclInt32, oxcclSum, survivor.get(), null_mut()) }
    });
    std::thread::sleep(Duration::from_millis(100));
    ok(oxcclCommAbort(comms[0].get()));
    assert_eq!(call.join().unwrap(), oxcclRemoteError);
    let mut state = oxcclSuccess;
    // SAFETY: `state` is writable.
    ok(unsafe { oxcclCommGetAsyncError(survivor.get(), &mut state) });
    assert_eq!(state, oxcclRemoteError);
    ok(oxcclCommDestroy(survivor.get()));
}

#[test]
fn float8_reduces_in_f32_and_rounds_to_nearest_even() {
    use oxccl_core::{F8E4M3, F8E5M2};
    let n = 3;
    let comms = init_all(n);
    on_each(&comms, |r, c| {
        // e4m3: small integers, so that every partial sum in any order is exact (integers up
        // to 16 are representable) and equals the f32 sum rounded once.
        let xs: Vec<f32> = (0..16).map(|i| (i % 4 + r) as f32).collect();
        let mut bits: Vec<u8> = xs.iter().map(|&x| F8E4M3::from_f32(x).to_bits()).collect();
        let p = void_mut(&mut bits);
        // SAFETY: 16 bytes.
        ok(unsafe { oxcclAllReduce(p, p, 16, oxcclFloat8e4m3, oxcclSum, c, null_mut()) });
        for (i, &b) in bits.iter().enumerate() {
            let exact: f32 = (0..n).map(|q| (i % 4 + q) as f32).sum();
            assert_eq!(F8E4M3::from_bits(b).to_f32(), exact, "element {i}");
        }
        // e5m2 max saturates instead of overflowing.
        let mut big = [F8E5M2::MAX.to_bits(); 2];
        let pb = void_mut(&mut big);
        // SAFETY: 2 bytes.
        ok(unsafe { oxcclAllReduce(pb, pb, 2, oxcclFloat8e5m2, oxcclSum, c, null_mut()) });
        assert_eq!(big, [F8E5M2::MAX.to_bits(); 2]);
        // A pre-multiplied sum on e4m3: 0.5 · (1 + r) summed.
        let mut k = F8E4M3::from_f32(0.5).to_bits();
        let mut op = -1;
        // SAFETY: `op` writable, `k` readable.
        ok(unsafe {
            oxcclRedOpCreatePreMulSum(
                &mut op,
                (&raw mut k).cast(),
                oxcclFloat8e4m3,
                oxcclScalarHostImmediate,
                c,
            )
        });
        let mut v = [F8E4M3::from_f32(1.0 + r as f32).to_bits(); 4];
        let pv = void_mut(&mut v);
        // SAFETY: 4 bytes.
        ok(unsafe { oxcclAllReduce(pv, pv, 4, oxcclFloat8e4m3, op, c, null_mut()) });
        assert_eq!(F8E4M3::from_bits(v[0]).to_f32(), 0.5 * 6.0);
        ok(oxcclRedOpDestroy(op, c));
    });
    destroy(comms);
}

#[test]
fn survivors_shrink_a_failed_communicator_and_go_on() {
    let n = 4;
    let comms = init_all(n);
    // Rank 2 fails (aborts, as a dying rank's peers see it); the others' next call fails.
    ok(oxcclCommAbort(comms[2].get()));
    on_each(&comms, |r, c| {
        if r == 2 {
            return;
        }
        let mut x = [1i32; 3];
        let p = void_mut(&mut x);
        // SAFETY: `x` holds 3 ints.
        let failed = unsafe { oxcclAllReduce(p, p, 3, oxcclInt32, oxcclSum, c, null_mut()) };
        assert_eq!(failed, oxcclRemoteError, "rank {r}: {}", last());
        let mut exclude = [2 as c_int];
        let mut child = null_mut();
        // SAFETY: `exclude` holds 1 int; `child` is writable; config NULL.
        ok(unsafe {
            oxcclCommShrink(
                c,
                exclude.as_mut_ptr(),
                1,
                &mut child,
                null_mut(),
                OXCCL_SHRINK_DEFAULT,
            )
        });
        let (mut rank, mut count) = (-1, -1);
        // SAFETY: both writable.
        unsafe {
            ok(oxcclCommUserRank(child, &mut rank));
            ok(oxcclCommCount(child, &mut count));
        }
        assert_eq!((rank, count), ([0, 1, -1, 2][r], 3), "rank {r}");
        let mut y = [rank + 1; 5];
        let q = void_mut(&mut y);
        // SAFETY: `y` holds 5 ints.
        ok(unsafe { oxcclAllReduce(q, q, 5, oxcclInt32, oxcclSum, child, null_mut()) });
        assert_eq!(y, [6; 5], "rank {r}");
        ok(oxcclCommDestroy(child));
    });
    let c = comms[0].get();
    let mut child = null_mut();
    let mut bad = [9 as c_int];
    let cases: [(*mut c_int, c_int, c_int, &str); 5] = [
        (bad.as_mut_ptr(), -1, 0, "excludeRanksCount"),
        (bad.as_mut_ptr(), 4, 0, "excludeRanksCount"),
        (bad.as_mut_ptr(), 1, 0, "excludeRanksList: 9"),
        (null_mut(), 1, 0, "excludeRanksList"),
        (null_mut(), 0, 7, "shrinkFlags"),
    ];
    for (list, count, flags, words) in cases {
        // SAFETY: `list` is NULL or holds 1 int, and every case with count > 1 is refused
        // before reading it; `child` is writable.
        fails(
            unsafe { oxcclCommShrink(c, list, count, &mut child, null_mut(), flags) },
            oxcclInvalidArgument,
            words,
        );
    }
    // Abort freed rank 2's handle (as ncclCommAbort does).
    destroy(
        comms
            .into_iter()
            .enumerate()
            .filter(|(r, _)| *r != 2)
            .map(|(_, c)| c)
            .collect(),
    );
}

/// A split with options makes its communicator with them (here a 0.5 s timeout, where the
/// parent has the environment's); a bad option fails the split on that rank alone, before it
/// joins anything.
#[test]
fn a_split_with_options_takes_them() {
    let comms = init_all(2);
    let mut bad = null_mut();
    // SAFETY: `bad` is writable; the options string is NUL-terminated.
    fails(
        unsafe {
            oxcclCommSplitOptions(
                comms[0].get(),
                0,
                0,
                &mut bad,
                null_mut(),
                c"OXCCL_TIMEOUT=soon".as_ptr(),
            )
        },
        oxcclInvalidArgument,
        "OXCCL_TIMEOUT",
    );
    let children = std::sync::Mutex::new(vec![Comm(null_mut()); 2]);
    on_each(&comms, |r, c| {
        let mut child = null_mut();
        // SAFETY: `child` is writable; the options string is NUL-terminated.
        ok(unsafe {
            oxcclCommSplitOptions(
                c,
                0,
                r as c_int,
                &mut child,
                null_mut(),
                c"OXCCL_TIMEOUT=0.5".as_ptr(),
            )
        });
        children.lock().unwrap()[r] = Comm(child);
    });
    let children = children.into_inner().unwrap();
    // Rank 0 alone: its all-reduce waits for rank 1 for the child's 0.5 s, not the parent's.
    let mut x = [1.0f32; 4];
    let p = void_mut(&mut x);
    let start = std::time::Instant::now();
    // SAFETY: 4 floats.
    fails(
        unsafe {
            oxcclAllReduce(
                p,
                p,
                4,
                oxcclFloat32,
                oxcclSum,
                children[0].get(),
                null_mut(),
            )
        },
        oxcclTimeout,
        "timed out after 500",
    );
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    for c in children {
        ok(oxcclCommAbort(c.get()));
    }
    destroy(comms);
}

#[test]
fn options_set_a_communicators_settings_in_place_of_the_environment() {
    let id = unique_id();
    let mut comm = null_mut();
    let create = |comm: &mut oxcclComm_t, n: c_int, options: &std::ffi::CStr| {
        // SAFETY: `comm` is writable, the id is valid, `options` is NUL-terminated.
        unsafe { oxcclCommInitRankOptions(comm, n, id, 0, null_mut(), options.as_ptr()) }
    };
    for (options, why) in [
        (c"OXCCL_TIMEOUT", "not NAME=VALUE"),
        (
            c"OXCCL_TIMEOUT=1;OXCCL_TIMEOUT=2",
            "OXCCL_TIMEOUT is set twice",
        ),
        (c"OXCCL_TIMEOUT=soon", "OXCCL_TIMEOUT"),
        (c"OXCCL_TRANSPORTS=pigeon", "pigeon"),
        (
            c"OXCCL_NO_SUCH=1",
            "\"OXCCL_NO_SUCH\" is not a setting of a communicator",
        ),
        (c"PATH=/", "\"PATH\" is not a setting"),
        (c"=5", "\"\" is not a setting"),
    ] {
        fails(create(&mut comm, 1, options), oxcclInvalidArgument, why);
    }
    // Not NUL-terminated within 64 KiB.
    let mut long_z = vec![b'x' as std::ffi::c_char; (64 << 10) + 8];
    long_z.push(0);
    fails(
        // SAFETY: `long_z` is NUL-terminated (past the bound the call reads).
        unsafe { oxcclCommInitRankOptions(&mut comm, 1, id, 0, null_mut(), long_z.as_ptr()) },
        oxcclInvalidArgument,
        "longer than",
    );
    // Settings that work: a one-rank communicator, empty items and spaces allowed, NULL too.
    ok(create(
        &mut comm,
        1,
        c" OXCCL_TIMEOUT = 5 ;; OXCCL_TRANSPORTS=shm,tcp ;",
    ));
    ok(oxcclCommDestroy(comm));
    // SAFETY: as above, NULL options.
    ok(unsafe { oxcclCommInitRankOptions(&mut comm, 1, id, 0, null_mut(), null()) });
    ok(oxcclCommDestroy(comm));
    // The timeout is this communicator's: a 2-rank creation whose other rank never comes fails
    // after the option's 0.3 s, not the environment's (default 300 s), and says it timed out.
    let id = unique_id();
    let start = Instant::now();
    // SAFETY: as above.
    let code = unsafe {
        oxcclCommInitRankOptions(
            &mut comm,
            2,
            id,
            0,
            null_mut(),
            c"OXCCL_TIMEOUT=0.3".as_ptr(),
        )
    };
    let took = start.elapsed();
    assert_ne!(
        code, oxcclSuccess,
        "a creation with a missing rank succeeded"
    );
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(20),
        "the creation gave up after {took:?}: {}",
        last()
    );
}

#[test]
fn failed_peer_is_minus_one_while_every_peer_lives() {
    // (A rank seen failing is told by heartbeats between processes: python/tests/test_failure.py
    // kills one as the others wait for it.)
    let comms = init_all(2);
    let mut peer = 7;
    // SAFETY: `peer` is writable.
    ok(unsafe { oxcclCommFailedPeer(comms[0].get(), &mut peer) });
    assert_eq!(peer, -1);
    // SAFETY: NULL is refused before anything is written.
    fails(
        unsafe { oxcclCommFailedPeer(comms[0].get(), null_mut()) },
        oxcclInvalidArgument,
        "peer",
    );
    for p in [0, 1] {
        let mut failed = 7;
        // SAFETY: `failed` is writable.
        ok(unsafe { oxcclCommPeerFailed(comms[0].get(), p, &mut failed) });
        assert_eq!(failed, 0, "rank {p}");
    }
    for bad in [-1, 2, i32::MAX] {
        let mut failed = 7;
        // SAFETY: `failed` is writable.
        fails(
            unsafe { oxcclCommPeerFailed(comms[0].get(), bad, &mut failed) },
            oxcclInvalidArgument,
            &format!("peer {bad} is not a rank"),
        );
        assert_eq!(failed, 7, "nothing written for peer {bad}");
    }
    // SAFETY: NULL is refused before anything is written.
    fails(
        unsafe { oxcclCommPeerFailed(comms[0].get(), 1, null_mut()) },
        oxcclInvalidArgument,
        "failed",
    );
    destroy(comms);
}
