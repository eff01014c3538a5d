//! The communicator's API beyond the collective matrix: asynchronous work, split, init from a
//! UniqueId, point-to-point groups, registered buffers, and argument errors that name the rank
//! and the call.

use std::time::Duration;

use oxccl::bootstrap::UniqueId;
use oxccl::config::TransportFilter;
use oxccl::{Communicator, Config, Error, ReduceOp};

fn local(n: usize, transport: &str) -> Vec<Communicator> {
    let config = Config::default()
        .transports(TransportFilter::only(&[transport]))
        .timeout(Duration::from_secs(30));
    Communicator::init_local(n, config).expect("init")
}

/// Runs `f` on every rank's thread and returns the results in rank order.
fn each<T: Send>(comms: &[Communicator], f: impl Fn(&Communicator) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(|| f(c))).collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

/// Ranks made by `init_rank` from one new unique id, each on a thread of its own (rank r with
/// `configs[r]`), each then running `then` on its communicator: the results in rank order,
/// creation's error where creation failed.
fn init_ranks<T: Send + 'static>(
    configs: Vec<Config>,
    then: fn(Communicator) -> oxccl::Result<T>,
) -> Vec<oxccl::Result<T>> {
    let bytes = *UniqueId::new().expect("unique id").as_bytes();
    let n = configs.len();
    let handles: Vec<_> = configs
        .into_iter()
        .enumerate()
        .map(|(rank, config)| {
            std::thread::spawn(move || {
                let id = UniqueId::from_bytes(&bytes).expect("id bytes");
                Communicator::init_rank(&id, n, rank, config).and_then(then)
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank thread"))
        .collect()
}

#[test]
fn async_work_owns_its_buffers_and_returns_them_reduced() {
    for transport in ["loopback", "tcp"] {
        let comms = local(3, transport);
        let out = each(&comms, |c| {
            let r = c.rank() as f32;
            // Several operations in flight at once, completed in order.
            let a = c.all_reduce_async(vec![r; 100_000], ReduceOp::Sum).unwrap();
            let b = c.all_gather_async(vec![r; 7], vec![0f32; 21]).unwrap();
            let bc = c
                .broadcast_async(vec![r + 10.0; 5].into_boxed_slice(), 2)
                .unwrap();
            let barrier = c.barrier_async().unwrap();
            let a = a.wait().unwrap();
            let (_, gathered) = b.wait().unwrap();
            let bc = bc.wait().unwrap();
            barrier.wait().unwrap();
            (a, gathered, bc)
        });
        for (rank, (a, gathered, bc)) in out.into_iter().enumerate() {
            assert!(a.iter().all(|&v| v == 3.0), "{transport} rank {rank}");
            let want: Vec<f32> = [0.0; 7]
                .into_iter()
                .chain([1.0; 7])
                .chain([2.0; 7])
                .collect();
            assert_eq!(gathered, want, "{transport} rank {rank}");
            assert_eq!(&*bc, &[12.0; 5], "{transport} rank {rank}");
        }
    }
}

#[test]
fn is_completed_turns_true_and_dropping_unfinished_work_waits_for_it() {
    let comms = local(2, "tcp");
    each(&comms, |c| {
        let w = c
            .all_reduce_async(vec![1u64; 1 << 20], ReduceOp::Sum)
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !w.is_completed() {
            assert!(std::time::Instant::now() < deadline, "never completed");
            std::thread::yield_now();
        }
        assert!(w.wait().unwrap().iter().all(|&v| v == 2));
        // Dropped before waiting: the drop blocks until the collective is done, so the next
        // collective still matches on both ranks.
        drop(
            c.all_reduce_async(vec![1u8; 1 << 16], ReduceOp::Max)
                .unwrap(),
        );
        let mut x = [c.rank() as i32; 3];
        c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
        assert_eq!(x, [1; 3]);
    });
}

#[test]
fn split_groups_by_color_and_orders_by_key() {
    let comms = local(6, "loopback");
    // Colors: even ranks → 0, odd ranks → 1, rank 5 opts out. Keys reverse the order.
    let out = each(&comms, |c| {
        let color = if c.rank() == 5 {
            None
        } else {
            Some((c.rank() % 2) as u32)
        };
        let sub = c.split(color, 100 - c.rank() as u32).unwrap();
        sub.map(|s| {
            let mut who = vec![0u64; s.size()];
            s.all_gather(&[c.rank() as u64], &mut who).unwrap();
            (s.rank(), s.size(), who)
        })
    });
    assert_eq!(out[5], None);
    assert_eq!(out[0], Some((2, 3, vec![4, 2, 0])));
    assert_eq!(out[2], Some((1, 3, vec![4, 2, 0])));
    assert_eq!(out[4], Some((0, 3, vec![4, 2, 0])));
    assert_eq!(out[1], Some((1, 2, vec![3, 1])));
    assert_eq!(out[3], Some((0, 2, vec![3, 1])));
    // The parent still works after the split.
    each(&comms, |c| c.barrier().unwrap());
}

#[test]
fn init_rank_from_a_unique_id_forms_one_communicator() {
    let id = UniqueId::new().expect("unique id");
    let bytes = *id.as_bytes();
    let handles: Vec<_> = (0..3)
        .map(|rank| {
            std::thread::spawn(move || {
                // Each rank rebuilds the id from its 128 bytes, as if sent over MPI.
                let id = UniqueId::from_bytes(&bytes).expect("id bytes");
                let c = Communicator::init_rank(
                    &id,
                    3,
                    rank,
                    Config::default().timeout(Duration::from_secs(30)),
                )?;
                let mut v = [rank as i64 + 1];
                c.all_reduce_in_place(&mut v, ReduceOp::Prod)?;
                Ok::<_, Error>((c.rank(), c.size(), v[0]))
            })
        })
        .collect();
    for (rank, h) in handles.into_iter().enumerate() {
        assert_eq!(h.join().expect("thread").expect("init_rank"), (rank, 3, 6));
    }
    assert!(Communicator::init_rank(&id, 3, 3, Config::default()).is_err());
}

/// Ranks whose settings would send calls different ways (another slice or scratch-slot count,
/// a forced algorithm or way, a topology fixture on one rank only) fail creation at once,
/// each naming the peer and the setting with both values — instead of sending one call
/// different ways (a scratch-slot count that differs reorders an in-place ring's messages
/// under identical descriptors: wrong sums) or, for the fixture, waiting for a topology the
/// other rank never publishes until the deadline.
#[test]
fn ranks_configured_differently_fail_creation_naming_the_setting() {
    let dump = std::env::temp_dir().join(format!("oxccl-settings-{}.json", std::process::id()));
    drop(
        Communicator::init_local(2, Config::default().topo_dump_file(Some(dump.clone())))
            .expect("init"),
    );
    let base = Config::default().timeout(Duration::from_secs(30));
    let cases = [
        (
            base.clone().scratch_slots(1),
            "OXCCL_SCRATCH_SLOTS=1",
            "OXCCL_SCRATCH_SLOTS=4",
        ),
        (
            base.clone().slice_bytes(64 << 10),
            "OXCCL_SLICE_BYTES=65536",
            "OXCCL_SLICE_BYTES=262144",
        ),
        (
            base.clone().algorithm(Some(oxccl::algo::Algorithm::Ring)),
            "OXCCL_ALGO=ring",
            "OXCCL_ALGO=auto",
        ),
        (
            base.clone().area_way(Some(oxccl::tune::Way::Staged)),
            "OXCCL_AREA_WAY=staged",
            "OXCCL_AREA_WAY=auto",
        ),
        (
            base.clone().direct_copy_min(usize::MAX),
            "OXCCL_DIRECT_COPY_MIN=off",
            "OXCCL_DIRECT_COPY_MIN=default",
        ),
        (
            base.clone().direct_min(1 << 20),
            "OXCCL_DIRECT_MIN/OXCCL_DIRECT_MAX=set (a fixed rule)",
            "OXCCL_DIRECT_MIN/OXCCL_DIRECT_MAX=unset (the tuner decides)",
        ),
        (
            base.clone().topo_file(Some(dump.clone())),
            "OXCCL_TOPO_FILE=a topology of digest",
            "OXCCL_TOPO_FILE=unset",
        ),
    ];
    for (odd, odd_value, base_value) in cases {
        let start = std::time::Instant::now();
        let results = init_ranks(vec![odd, base.clone()], |_| Ok(()));
        for (rank, result) in results.into_iter().enumerate() {
            let (peer, says) = if rank == 0 {
                (1, [base_value, odd_value])
            } else {
                (0, [odd_value, base_value])
            };
            match result {
                Err(Error::InvalidArgument(m)) => {
                    let want = format!("rank {rank}: creation: rank {peer} runs with {}", says[0]);
                    assert!(m.contains(&want), "{m}\nwants: {want}");
                    assert!(m.contains(&format!("this rank with {}", says[1])), "{m}");
                }
                other => panic!("rank {rank}, {odd_value}: {other:?}"),
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{odd_value}: {:?}",
            start.elapsed()
        );
    }
    std::fs::remove_file(&dump).unwrap();
}

/// A rank whose creation fails before it published its connection information (here: a
/// topology fixture that cannot be read) says so in the store: the others fail at once with
/// `PeerFailed` naming it and its reason, where they waited for it until the deadline. And
/// spelling out the default transports but `loopback` (which joins only threads of one
/// process) is no difference between ranks.
#[test]
fn a_rank_that_fails_before_it_publishes_is_named_at_once() {
    let start = std::time::Instant::now();
    let missing = std::env::temp_dir().join(format!("oxccl-missing-{}.json", std::process::id()));
    let base = Config::default().timeout(Duration::from_secs(30));
    let results = init_ranks(
        vec![base.clone().topo_file(Some(missing)), base.clone()],
        |_| Ok(()),
    );
    match &results[0] {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("cannot be read"), "{m}"),
        other => panic!("rank 0: {other:?}"),
    }
    match &results[1] {
        Err(Error::PeerFailed {
            rank: 1,
            peer: 0,
            op,
            cause,
        }) => assert!(
            op.contains("creation") && cause.contains("OXCCL_TOPO_FILE"),
            "{op}: {cause}"
        ),
        other => panic!("rank 1: {other:?}"),
    }
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );

    let spelled: TransportFilter = "shm,rdma,tcp".parse().expect("filter");
    let sums = init_ranks(vec![base.clone().transports(spelled), base], |c| {
        let mut v = [c.rank() as f32 + 1.0];
        c.all_reduce_in_place(&mut v, ReduceOp::Sum)?;
        Ok(v[0])
    });
    for sum in sums {
        assert_eq!(sum.expect("spelled-out transports"), 3.0);
    }
}

/// Ranks given different sizes for one id are named at once (each reads the other's size),
/// and a rank that never comes is a `Timeout` naming it at the deadline.
#[test]
fn a_rank_given_another_size_or_never_coming_is_named() {
    let id = UniqueId::new().expect("unique id");
    let bytes = *id.as_bytes();
    let start = std::time::Instant::now();
    let handles: Vec<_> = [(0, 2), (1, 3)]
        .into_iter()
        .map(|(rank, size)| {
            std::thread::spawn(move || {
                let id = UniqueId::from_bytes(&bytes).expect("id bytes");
                let config = Config::default().timeout(Duration::from_secs(30));
                Communicator::init_rank(&id, size, rank, config).map(|_| ())
            })
        })
        .collect();
    for (h, says) in handles.into_iter().zip([
        "rank 0: creation: rank 1 was given 3 ranks, this rank 2",
        "rank 1: creation: rank 0 was given 2 ranks, this rank 3",
    ]) {
        match h.join().expect("thread") {
            Err(Error::InvalidArgument(m)) => assert!(m.contains(says), "{m}"),
            other => panic!("{other:?}"),
        }
    }
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );

    let id = UniqueId::new().expect("unique id");
    let config = Config::default().timeout(Duration::from_millis(500));
    match Communicator::init_rank(&id, 2, 0, config) {
        Err(Error::Timeout { rank, op, peer, .. }) => {
            assert_eq!((rank, peer), (0, Some(1)), "{op}");
            assert!(op.contains("communicator creation (2 ranks"), "{op}");
        }
        other => panic!("{:?}", other.map(|c| c.size())),
    }
}

/// Two processes given the same rank (here two threads): every creation times out, and the
/// error says which rank was created twice instead of only naming the rank that never came.
#[test]
fn a_rank_given_to_two_processes_is_named_at_the_deadline() {
    let id = UniqueId::new().expect("unique id");
    let bytes = *id.as_bytes();
    let handles: Vec<_> = [0, 1, 1]
        .into_iter()
        .enumerate()
        .map(|(i, rank)| {
            // The second rank 1 joins after the first (its creation is the second).
            std::thread::sleep(Duration::from_millis(if i == 2 { 300 } else { 0 }));
            std::thread::spawn(move || {
                let id = UniqueId::from_bytes(&bytes).expect("id bytes");
                let config = Config::default().timeout(Duration::from_millis(1500));
                Communicator::init_rank(&id, 3, rank, config).map(|_| ())
            })
        })
        .collect();
    let expect = [
        (
            0,
            2,
            "rank 1 was created 2 times in this job's store while this is creation 1 of rank 0",
        ),
        (
            1,
            2,
            "rank 1 was created 2 times in this job's store while this is creation 1 of rank 1",
        ),
        (
            1,
            0,
            "this is creation 2 of rank 1 in this job's store, and no other rank was created \
                more than 1 times: was another process given rank 1?",
        ),
    ];
    for (h, (r, p, says)) in handles.into_iter().zip(expect) {
        match h.join().expect("thread") {
            Err(Error::Timeout { rank, op, peer, .. }) => {
                assert_eq!((rank, peer), (r, Some(p)), "{op}");
                assert!(op.contains(says), "{op}");
            }
            other => panic!("{other:?}"),
        }
    }
}

/// With `unique_id_server_with_comm`, rank 0's communicator keeps the store server of the
/// UniqueId this process made: it serves the communicator's splits (which keep it too), and
/// stops once they are all gone, where by default it serves until the process exits.
#[test]
fn a_unique_id_server_kept_by_its_communicator_stops_with_it() {
    for with_comm in [true, false] {
        let id = UniqueId::new().expect("unique id");
        let made: Vec<_> = (0..2)
            .map(|rank| {
                let id = id.clone();
                std::thread::spawn(move || {
                    let mut config = Config::default().timeout(Duration::from_secs(20));
                    config.unique_id_server_with_comm = with_comm;
                    let c = Communicator::init_rank(&id, 2, rank, config)?;
                    let child = c.split(Some(0), rank as u32)?.expect("a member");
                    drop(c); // the split goes on with the server
                    let mut v = [rank as i64 + 1];
                    child.all_reduce_in_place(&mut v, ReduceOp::Sum)?;
                    Ok::<_, Error>(v[0])
                })
            })
            .collect();
        for h in made {
            assert_eq!(h.join().expect("thread").expect("communicator"), 3);
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(1);
        let served = id.connect(deadline).is_ok();
        assert_eq!(
            served, !with_comm,
            "with_comm {with_comm}: the id's store server serves: {served}"
        );
    }
}

/// The same UniqueId serves one communicator after another: each creation meets the others'
/// of the same generation and never reads the keys (endpoints long closed) an earlier one left.
#[test]
fn a_unique_id_reused_after_destroy_forms_a_fresh_communicator() {
    let id = UniqueId::new().expect("unique id");
    for round in 0..3i64 {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let id = id.clone();
                std::thread::spawn(move || {
                    // Over TCP each communicator listens on new ports, so a stale endpoint
                    // would not connect.
                    let config = Config::default()
                        .transports(oxccl::config::TransportFilter::only(&["tcp"]))
                        .timeout(Duration::from_secs(10));
                    // Rank 0 comes late, so rank 1 (which connects to it) would find the last
                    // round's address of rank 0.
                    if rank == 0 {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    let c = Communicator::init_rank(&id, 2, rank, config)?;
                    let mut v = [rank as i64 + 10 * round];
                    c.all_reduce_in_place(&mut v, ReduceOp::Sum)?;
                    Ok::<_, Error>(v[0])
                })
            })
            .collect();
        for h in handles {
            assert_eq!(
                h.join().expect("thread").expect("init_rank"),
                1 + 20 * round
            );
        }
    }
}

#[test]
fn paired_large_sends_in_a_group_do_not_deadlock() {
    let comms = local(4, "tcp");
    let n = 3 << 20; // several slices each way
    let out = each(&comms, |c| {
        let (r, size) = (c.rank(), c.size());
        let (next, prev) = ((r + 1) % size, (r + size - 1) % size);
        let mine = vec![r as u32; n];
        let mut from_prev = vec![0u32; n];
        let mut from_next = vec![0u32; n];
        let mut selfie = vec![0u32; 5];
        let mut g = c.group();
        g.send(&mine, next).unwrap();
        g.send(&mine, prev).unwrap();
        g.recv(&mut from_prev, prev).unwrap();
        g.recv(&mut from_next, next).unwrap();
        g.send(&mine[..5], r).unwrap();
        g.recv(&mut selfie, r).unwrap();
        g.run().unwrap();
        (from_prev[n - 1], from_next[0], selfie)
    });
    for (r, (p, nx, selfie)) in out.into_iter().enumerate() {
        assert_eq!(p as usize, (r + 3) % 4);
        assert_eq!(nx as usize, (r + 1) % 4);
        assert_eq!(selfie, vec![r as u32; 5]);
    }
}

/// Messages far longer than the slice a link carries (64 B here: a 1 MiB message is 16,384
/// slices, four windows of what the engine keeps in flight per peer and direction), several to
/// the same peer: they arrive whole and in order, over shared memory and TCP.
#[test]
fn long_messages_in_small_slices_arrive_whole_and_in_order() {
    let pattern = |from: usize, k: usize, len: usize| -> Vec<u8> {
        (0..len)
            .map(|i| (i.wrapping_mul(31) ^ (from * 7) ^ (k * 101)) as u8)
            .collect()
    };
    let lens = [(1 << 20) + 13, 5, 300_001];
    for transport in ["shm", "tcp"] {
        let config = Config::default()
            .transports(TransportFilter::only(&[transport]))
            .slice_bytes(64)
            .timeout(Duration::from_secs(60));
        let comms = Communicator::init_local(3, config).expect("init");
        let out = each(&comms, |c| {
            let (r, n) = (c.rank(), c.size());
            let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
            let mine: Vec<Vec<u8>> = (0..lens.len()).map(|k| pattern(r, k, lens[k])).collect();
            let mut got: Vec<Vec<u8>> = lens.iter().map(|&l| vec![0u8; l]).collect();
            let mut g = c.group();
            for m in &mine {
                g.send(m, next).unwrap();
            }
            for buf in got.iter_mut() {
                g.recv(buf, prev).unwrap();
            }
            g.run().unwrap();
            got
        });
        for (r, got) in out.into_iter().enumerate() {
            let prev = (r + 2) % 3;
            for (k, buf) in got.iter().enumerate() {
                assert!(
                    *buf == pattern(prev, k, lens[k]),
                    "{transport}: rank {r}, message {k} from rank {prev} differs"
                );
            }
        }
    }
}

#[test]
fn blocking_send_and_recv_pair_up() {
    let comms = local(2, "tcp");
    let out = each(&comms, |c| {
        if c.rank() == 0 {
            c.send(&[1.5f64, 2.5], 1).unwrap();
            let mut back = [0f64; 2];
            c.recv(&mut back, 1).unwrap();
            back
        } else {
            let mut got = [0f64; 2];
            c.recv(&mut got, 0).unwrap();
            c.send(&[got[0] * 2.0, got[1] * 2.0], 0).unwrap();
            got
        }
    });
    assert_eq!(out, vec![[3.0, 5.0], [1.5, 2.5]]);
}

#[test]
fn bad_arguments_are_errors_naming_the_rank_and_the_call() {
    let comms = local(2, "loopback");
    let c = &comms[1];
    let check = |r: oxccl::Result<()>, words: &[&str]| {
        let e = r.expect_err("must fail");
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        let text = e.to_string();
        assert!(text.contains("rank 1"), "{text}");
        for w in words {
            assert!(text.contains(w), "{text} lacks {w}");
        }
    };
    check(
        c.all_reduce(&[1f32; 4], &mut [0f32; 5], ReduceOp::Sum),
        &["all_reduce", "recv"],
    );
    check(
        c.all_reduce(&[1f32; 4], &mut [0f32; 4], ReduceOp::BAnd),
        &["all_reduce", "band"],
    );
    check(
        c.broadcast_in_place(&mut [1u8; 4], 2),
        &["broadcast", "root 2"],
    );
    check(
        c.reduce_scatter(&[1i32; 5], &mut [0i32; 2], ReduceOp::Sum),
        &["reduce_scatter", "send"],
    );
    check(c.all_gather(&[1i8; 3], &mut [0i8; 5]), &["all_gather"]);
    check(c.all_to_all(&[1u32; 3], &mut [0u32; 3]), &["all_to_all"]);
    check(c.gather(&[1u8; 2], &mut [0u8; 4], 7), &["gather", "root 7"]);
    check(
        c.all_reduce_bytes(
            &[0u8; 7],
            &mut [0u8; 7],
            oxccl::DataType::F32,
            ReduceOp::Sum,
        ),
        &["all_reduce", "whole number"],
    );
    check(c.send(&[1u8], 2), &["send", "peer 2"]);
    check(c.recv(&mut [1u8], 9), &["recv", "peer 9"]);
    // Nothing was sent: both ranks still run a collective together afterwards.
    each(&comms, |c| c.barrier().unwrap());
}

#[test]
fn registered_buffers_reduce_alike_where_the_links_need_no_registration() {
    // Shared memory, TCP and in-process queues take registrations and ignore them (rdma sends
    // out of them without a copy: transports/rdma/tests/rxe.rs, in the Soft-RoCE VM).
    for transport in ["loopback", "tcp", "shm"] {
        let comms = local(2, transport);
        let out = each(&comms, |c| {
            let r = c.rank() as f32;
            let mut buf = vec![r + 1.0; 300_001];
            let empty: [f32; 0] = [];
            // SAFETY: both buffers outlive their registrations (dropped at the end of the
            // closure, `buf` and `empty` after them).
            let reg = unsafe { c.register(buf.as_ptr().cast(), buf.len() * 4) }.unwrap();
            // SAFETY: as above.
            let none = unsafe { c.register(empty.as_ptr().cast(), 0) }.unwrap();
            assert_eq!(reg.range(), (buf.as_ptr() as usize, buf.len() * 4));
            c.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
            c.deregister(none);
            c.all_reduce_in_place(&mut buf, ReduceOp::Max).unwrap();
            drop(reg);
            c.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
            buf
        });
        for (rank, buf) in out.into_iter().enumerate() {
            assert!(buf.iter().all(|&v| v == 6.0), "{transport} rank {rank}");
        }
    }
}

/// Sends and receives started one by one, in the order torch.distributed's Gloo users write
/// them: every rank starts its send to the next rank, then its receive from the previous one
/// (two ranks both send first). Messages of 8 MiB, more than any link buffers, so a send
/// completes only once its peer receives it: the receive must run while the send waits. Over
/// shared memory and TCP, 2 and 3 ranks.
#[test]
fn sends_and_receives_started_one_by_one_run_together() {
    let n = 2 << 20; // u32s: 8 MiB
    for transport in ["shm", "tcp"] {
        for size in [2, 3] {
            let comms = local(size, transport);
            let out = each(&comms, |c| {
                let r = c.rank();
                let (next, prev) = ((r + 1) % size, (r + size - 1) % size);
                let mine: Vec<u32> = (0..n as u32).map(|i| i ^ (r as u32) << 24).collect();
                let sent = c.send_async(mine, next).unwrap();
                let got = c.recv_async(vec![0u32; n], prev).unwrap();
                let got = got.wait().unwrap();
                let mine = sent.wait().unwrap();
                (got, mine)
            });
            for (r, (got, _)) in out.iter().enumerate() {
                let prev = (r + size - 1) % size;
                assert!(
                    got.iter()
                        .enumerate()
                        .all(|(i, &v)| v == (i as u32) ^ (prev as u32) << 24),
                    "{transport}, {size} ranks: rank {r} did not receive rank {prev}'s message"
                );
            }
        }
    }
}

/// The k-th send to a peer pairs with the peer's k-th receive from this rank whatever the
/// groups: two sends in one group meet two blocking receives, and a started receive, a
/// blocking send and a started send meet their counterparts in another order.
#[test]
fn messages_pair_in_order_across_groups() {
    let comms = local(2, "shm");
    let out = each(&comms, |c| {
        if c.rank() == 0 {
            let (a, b) = (vec![1u64; 300_000], vec![2u64; 5]);
            let mut g = c.group();
            g.send(&a, 1).unwrap().send(&b, 1).unwrap();
            g.run().unwrap();
            let back = c.recv_async(vec![0u64; 3], 1).unwrap();
            c.send(&[7u64, 8], 1).unwrap();
            let last = c.send_async(vec![9u64; 4], 1).unwrap();
            last.wait().unwrap();
            back.wait().unwrap()
        } else {
            let mut a = vec![0u64; 300_000];
            let mut b = vec![0u64; 5];
            c.recv(&mut a, 0).unwrap();
            c.recv(&mut b, 0).unwrap();
            assert!(
                a.iter().all(|&v| v == 1) && b == [2; 5],
                "rank 1: first two messages"
            );
            let (mut x, mut y) = ([0u64; 2], [0u64; 4]);
            let mut g = c.group();
            g.recv(&mut x, 0).unwrap().recv(&mut y, 0).unwrap();
            g.run().unwrap();
            c.send(&[x[0] + y[0], x[1], y[3]], 0).unwrap();
            vec![x[0], x[1], y[0]]
        }
    });
    assert_eq!(out[1], vec![7, 8, 9]);
    assert_eq!(out[0], vec![16, 8, 9]);
}

/// A receive that does not match the peer's send fails at the receiver with both messages in
/// the error, and its memory keeps what it held.
#[test]
fn a_receive_of_the_wrong_length_is_a_mismatch() {
    let comms = local(2, "tcp");
    let out = each(&comms, |c| {
        if c.rank() == 0 {
            // Sent eagerly: whether this rank hears of the receiver's failure in time is a race.
            let _ = c.send(&[1u32; 4], 1);
            None
        } else {
            let w = c.recv_async(vec![5u32; 2], 0).unwrap();
            Some(w.wait())
        }
    });
    match out[1].as_ref().expect("rank 1") {
        Err(
            e @ Error::Mismatch {
                rank: 1, peer: 0, ..
            },
        ) => {
            let text = e.to_string();
            for needle in ["receive #0 of 8 B", "send #0 of 16 B"] {
                assert!(text.contains(needle), "{text:?} lacks {needle:?}");
            }
        }
        other => panic!("rank 1: expected a mismatch with rank 0, got {other:?}"),
    }
}

/// Two threads of each rank: one waits for a started send of 64 MiB, the other then starts
/// the receive the peer's send needs. Whichever thread drives the communicator meanwhile (the
/// waiter or the progress thread) lets go of it for the thread that queues the receive, on
/// both ranks, so neither waits for its deadline (10 s here).
#[test]
fn a_thread_waiting_on_a_send_lets_another_start_the_receive() {
    let n = 64 << 20;
    let config = Config::default()
        .transports(TransportFilter::only(&["shm"]))
        .timeout(Duration::from_secs(10));
    let comms = Communicator::init_local(2, config).expect("init");
    let out = each(&comms, |c| {
        let peer = 1 - c.rank();
        let sent = c.send_async(vec![c.rank() as u8 + 1; n], peer).unwrap();
        std::thread::scope(|s| {
            let waiter = s.spawn(move || sent.wait().map(drop));
            // Let the waiter take the lock and drive first.
            std::thread::sleep(Duration::from_millis(50));
            let got = c.recv_async(vec![0u8; n], peer).and_then(|w| w.wait());
            (waiter.join().expect("waiter"), got)
        })
    });
    for (r, (sent, got)) in out.into_iter().enumerate() {
        sent.unwrap_or_else(|e| panic!("rank {r}: send: {e}"));
        let got = got.unwrap_or_else(|e| panic!("rank {r}: recv: {e}"));
        assert!(
            got.iter().all(|&b| b as usize == 2 - r),
            "rank {r}: wrong data"
        );
    }
}

/// A mismatch on one of several started operations fails that one with the mismatch; the
/// others, unfinished, fail as aborted because of it.
#[test]
fn a_mismatch_fails_the_operation_it_concerns() {
    let comms = local(3, "shm");
    let out = each(&comms, |c| match c.rank() {
        1 => {
            let from0 = c.recv_async(vec![0u32; 2], 0).unwrap();
            let from2 = c.recv_async(vec![0u32; 2], 2).unwrap();
            Some((from0.wait().map(drop), from2.wait().map(drop)))
        }
        2 => {
            let _ = c.send(&[7u32; 4], 1);
            None
        }
        _ => None, // rank 0 never sends: rank 1's first receive is still waiting
    });
    let (from0, from2) = out[1].as_ref().expect("rank 1");
    match from2 {
        Err(
            e @ Error::Mismatch {
                rank: 1, peer: 2, ..
            },
        ) => {
            assert!(e.to_string().contains("receive #0 of 8 B"), "{e}")
        }
        other => panic!("rank 1, receive from 2: expected a mismatch, got {other:?}"),
    }
    match from0 {
        Err(Error::Aborted { rank: 1, why, .. }) => {
            assert!(why.contains("does not match"), "{why}")
        }
        other => panic!("rank 1, receive from 0: expected aborted, got {other:?}"),
    }
}

/// A small deterministic generator (xorshift64*), so every rank draws the same script.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The bytes of message `k` from rank `from` to rank `to` in round `round`.
fn message(round: usize, from: usize, to: usize, k: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(131) ^ (round * 7) ^ (from * 31) ^ (to * 17) ^ (k * 101)) as u8)
        .collect()
}

/// Point-to-point traffic in random orders: per round, every ordered pair of ranks exchanges
/// 0-3 messages of random lengths (empty, small, larger than a slice, larger than a link
/// buffers), and each rank starts its sends and receives interleaved at random (the order per
/// peer and direction kept), alone (send_async, recv_async) or several as one group
/// (start_point_to_point_raw), then waits for them in random order; some rounds end with an
/// all-reduce. Every message arrives whole, in order, with the right bytes, over shared
/// memory and TCP, 3 ranks.
#[test]
fn random_orders_of_started_sends_receives_and_groups_deliver_every_message() {
    const ROUNDS: usize = 40;
    const LENS: [usize; 6] = [0, 1, 100, 4096, 300_001, 3 << 20];
    for transport in ["shm", "tcp"] {
        let comms = local(3, transport);
        each(&comms, |c| {
            let (me, n) = (c.rank(), c.size());
            for round in 0..ROUNDS {
                // The script, the same on every rank: lengths of the messages per (from, to).
                let mut script = Rng(0x9e37_79b9 + round as u64);
                let mut lens = vec![vec![Vec::new(); n]; n];
                for (from, row) in lens.iter_mut().enumerate() {
                    for (to, l) in row.iter_mut().enumerate() {
                        if from != to {
                            *l = (0..script.below(4))
                                .map(|_| LENS[script.below(LENS.len())])
                                .collect();
                        }
                    }
                }
                // This rank's queues per (peer, direction), merged at random.
                let mut mine = Rng(0x5555 + (round * 16 + me) as u64);
                let mut queues: Vec<std::collections::VecDeque<(bool, usize, usize)>> = Vec::new();
                for p in (0..n).filter(|&p| p != me) {
                    queues.push((0..lens[me][p].len()).map(|k| (true, p, k)).collect());
                    queues.push((0..lens[p][me].len()).map(|k| (false, p, k)).collect());
                }
                let mut order = Vec::new();
                while queues.iter().any(|q| !q.is_empty()) {
                    let live: Vec<usize> = (0..queues.len())
                        .filter(|&q| !queues[q].is_empty())
                        .collect();
                    let q = live[mine.below(live.len())];
                    order.push(queues[q].pop_front().expect("live"));
                }
                // Buffers: sends hold their bytes, receives are filled with a marker.
                let mut bufs: Vec<Vec<u8>> = order
                    .iter()
                    .map(|&(send, p, k)| {
                        if send {
                            message(round, me, p, k, lens[me][p][k])
                        } else {
                            vec![0xEE; lens[p][me][k]]
                        }
                    })
                    .collect();
                let mut sends = Vec::new();
                let mut recvs = Vec::new();
                let mut groups = Vec::new();
                let mut at = 0;
                let mut taken = std::mem::take(&mut bufs)
                    .into_iter()
                    .map(Some)
                    .collect::<Vec<_>>();
                while at < order.len() {
                    let chunk = 1 + mine.below(3).min(order.len() - at - 1);
                    if chunk == 1 && mine.below(2) == 0 {
                        let (send, p, k) = order[at];
                        let buf = taken[at].take().expect("once");
                        if send {
                            sends.push(c.send_async(buf, p).unwrap());
                        } else {
                            recvs.push(((p, k), c.recv_async(buf, p).unwrap()));
                        }
                    } else {
                        let messages: Vec<oxccl::RawMessage> = (at..at + chunk)
                            .map(|i| {
                                let (send, peer, _) = order[i];
                                let b = taken[i].as_mut().expect("kept");
                                oxccl::RawMessage {
                                    peer,
                                    send,
                                    ptr: b.as_mut_ptr(),
                                    len: b.len(),
                                    tag: 0,
                                }
                            })
                            .collect();
                        // SAFETY: the buffers stay in `taken`, untouched and unmoved (their
                        // heap memory), until the Pending is waited for below.
                        let pending = unsafe { c.start_point_to_point_raw(&messages) }.unwrap();
                        groups.push(pending);
                    }
                    at += chunk;
                }
                // Wait in a random order: every kind interleaved.
                let got = std::sync::Mutex::new(Vec::new());
                let mut all: Vec<Box<dyn FnOnce() + '_>> = Vec::new();
                for s in sends {
                    all.push(Box::new(move || drop(s.wait().unwrap())));
                }
                for ((p, k), r) in recvs {
                    let got = &got;
                    all.push(Box::new(move || {
                        got.lock().unwrap().push(((p, k), r.wait().unwrap()))
                    }));
                }
                for g in groups {
                    all.push(Box::new(move || g.wait().unwrap()));
                }
                while !all.is_empty() {
                    let i = mine.below(all.len());
                    (all.swap_remove(i))();
                }
                drop(all);
                let mut got = got.into_inner().unwrap();
                for (i, &(send, p, k)) in order.iter().enumerate() {
                    if !send && let Some(b) = taken[i].take() {
                        got.push(((p, k), b));
                    }
                }
                for ((p, k), b) in got {
                    assert!(
                        b == message(round, p, me, k, lens[p][me][k]),
                        "{transport}, round {round}: rank {me}'s message {k} from rank {p} differs"
                    );
                }
                if round % 3 == 2 {
                    let mut x = vec![me as u64 + 1; 5];
                    c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
                    assert_eq!(x, vec![(n * (n + 1) / 2) as u64; 5]);
                }
            }
        });
    }
}
