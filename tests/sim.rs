//! The simulator catches what a broken schedule does: deadlock, unmatched and mis-sized
//! messages, regions outside their buffers, bad peers and dependencies, and data races.

use oxccl::algo::sim::{self, RankBuffers, SimConfig, SimError};
use oxccl::algo::{Buffer, Op, Region, Schedule};
use oxccl::reduce::Cpu;
use oxccl::types::{DataType, ReduceOp};

fn out(offset: usize, len: usize) -> Region {
    Region::new(Buffer::Output, offset, len)
}

fn input(offset: usize, len: usize) -> Region {
    Region::new(Buffer::Input, offset, len)
}

fn run(schedules: &[Schedule], config: SimConfig) -> Result<sim::SimReport, SimError> {
    let mut bufs = vec![
        RankBuffers {
            input: vec![1; 16],
            output: vec![0; 16]
        };
        schedules.len()
    ];
    sim::simulate(schedules, DataType::U8, &mut bufs, &Cpu, &config)
}

#[test]
fn exchange_moves_data_and_counts_traffic() {
    let s = |peer| {
        Schedule::from_steps(
            [
                (
                    Op::Send {
                        to: peer,
                        src: input(0, 4),
                    },
                    vec![],
                ),
                (
                    Op::RecvReduce {
                        from: peer,
                        dst: out(0, 4),
                        src: input(0, 4),
                        op: ReduceOp::Sum,
                    },
                    vec![],
                ),
            ],
            0,
        )
    };
    let mut bufs = vec![
        RankBuffers {
            input: vec![1, 2, 3, 4],
            output: vec![0; 4],
        },
        RankBuffers {
            input: vec![10, 20, 30, 40],
            output: vec![0; 4],
        },
    ];
    let report = sim::simulate(
        &[s(1), s(0)],
        DataType::U8,
        &mut bufs,
        &Cpu,
        &SimConfig::default(),
    )
    .unwrap();
    assert_eq!(bufs[0].output, vec![11, 22, 33, 44]);
    assert_eq!(bufs[1].output, vec![11, 22, 33, 44]);
    assert_eq!(report.rounds, 1);
    assert_eq!(report.ranks[0].bytes_sent, 4);
    assert_eq!(report.ranks[1].bytes_received, 4);
    // One message of 4 bytes: alpha + 4 beta.
    let m = SimConfig::default().model;
    assert!(
        (report.time - (m.alpha + 4.0 * m.beta)).abs() < 1e-12,
        "{}",
        report.time
    );
}

#[test]
fn receive_before_send_on_both_sides_deadlocks() {
    let s = |peer| {
        Schedule::from_steps(
            [
                (
                    Op::Recv {
                        from: peer,
                        dst: out(0, 4),
                    },
                    vec![],
                ),
                (
                    Op::Send {
                        to: peer,
                        src: input(0, 4),
                    },
                    vec![0],
                ),
            ],
            0,
        )
    };
    match run(&[s(1), s(0)], SimConfig::default()) {
        Err(SimError::Deadlock { pending, stuck }) => {
            assert_eq!(pending, 4);
            assert!(!stuck.is_empty());
        }
        other => panic!("expected deadlock, got {other:?}"),
    }
}

#[test]
fn one_buffered_message_per_link_is_the_contract() {
    // Rank 0 sends a and b to rank 1, then waits (through rank 2) for rank 1 — who consumes a
    // only after hearing from rank 2. With one slot per link, b cannot leave until a is consumed,
    // so nothing moves; with two slots it completes.
    let r0 = Schedule::from_steps(
        [
            (
                Op::Send {
                    to: 1,
                    src: input(0, 1),
                },
                vec![],
            ),
            (
                Op::Send {
                    to: 1,
                    src: input(1, 1),
                },
                vec![],
            ),
            (
                Op::Send {
                    to: 2,
                    src: input(2, 1),
                },
                vec![1],
            ),
        ],
        0,
    );
    let r1 = Schedule::from_steps(
        [
            (
                Op::Recv {
                    from: 2,
                    dst: out(0, 1),
                },
                vec![],
            ),
            (
                Op::Recv {
                    from: 0,
                    dst: out(1, 1),
                },
                vec![0],
            ),
            (
                Op::Recv {
                    from: 0,
                    dst: out(2, 1),
                },
                vec![],
            ),
        ],
        0,
    );
    let r2 = Schedule::from_steps(
        [
            (
                Op::Recv {
                    from: 0,
                    dst: out(0, 1),
                },
                vec![],
            ),
            (
                Op::Send {
                    to: 1,
                    src: input(0, 1),
                },
                vec![0],
            ),
        ],
        0,
    );
    let all = [r0, r1, r2];
    assert!(matches!(
        run(&all, SimConfig::default()),
        Err(SimError::Deadlock { .. })
    ));
    let two = SimConfig {
        link_buffer: 2,
        ..SimConfig::default()
    };
    assert!(run(&all, two).is_ok());
}

#[test]
fn unmatched_and_mis_sized_messages_are_reported() {
    let send = Schedule::from_steps(
        [(
            Op::Send {
                to: 1,
                src: input(0, 4),
            },
            vec![],
        )],
        0,
    );
    let nothing = Schedule::default();
    assert!(matches!(
        run(&[send.clone(), nothing], SimConfig::default()),
        Err(SimError::Unmatched {
            from: 0,
            to: 1,
            sends: 1,
            recvs: 0
        })
    ));
    let short = Schedule::from_steps(
        [(
            Op::Recv {
                from: 0,
                dst: out(0, 3),
            },
            vec![],
        )],
        0,
    );
    assert!(matches!(
        run(&[send, short], SimConfig::default()),
        Err(SimError::SizeMismatch {
            from: 0,
            to: 1,
            index: 0,
            sent: 4,
            expected: 3
        })
    ));
}

#[test]
fn bad_regions_peers_and_dependencies_are_reported() {
    let oob = Schedule::from_steps(
        [(
            Op::Copy {
                dst: out(10, 10),
                src: input(0, 10),
            },
            vec![],
        )],
        0,
    );
    assert!(matches!(
        run(&[oob], SimConfig::default()),
        Err(SimError::OutOfBounds {
            rank: 0,
            step: 0,
            buffer_len: 16,
            ..
        })
    ));
    let scratch = Schedule::from_steps(
        [(
            Op::Copy {
                dst: Region::new(Buffer::Scratch, 0, 8),
                src: input(0, 8),
            },
            vec![],
        )],
        4,
    );
    assert!(matches!(
        run(&[scratch], SimConfig::default()),
        Err(SimError::OutOfBounds { .. })
    ));
    let to_self = Schedule::from_steps(
        [(
            Op::Send {
                to: 0,
                src: input(0, 1),
            },
            vec![],
        )],
        0,
    );
    assert!(matches!(
        run(&[to_self], SimConfig::default()),
        Err(SimError::BadPeer { peer: 0, .. })
    ));
    let forward = Schedule::from_steps(
        [
            (
                Op::Copy {
                    dst: out(0, 1),
                    src: input(0, 1),
                },
                vec![1],
            ),
            (
                Op::Copy {
                    dst: out(1, 1),
                    src: input(1, 1),
                },
                vec![],
            ),
        ],
        0,
    );
    assert!(matches!(
        run(&[forward], SimConfig::default()),
        Err(SimError::BadDependency {
            step: 0,
            dep: 1,
            ..
        })
    ));
}

#[test]
fn unordered_write_after_send_is_a_race() {
    // The receive overwrites the bytes the send is still reading, with no dependency.
    let s = |peer| {
        Schedule::from_steps(
            [
                (
                    Op::Send {
                        to: peer,
                        src: out(0, 4),
                    },
                    vec![],
                ),
                (
                    Op::Recv {
                        from: peer,
                        dst: out(0, 4),
                    },
                    vec![],
                ),
            ],
            0,
        )
    };
    assert!(matches!(
        run(&[s(1), s(0)], SimConfig::default()),
        Err(SimError::Race {
            rank: 0,
            first: 0,
            second: 1
        })
    ));
    // Ordered, it is fine.
    let ok = |peer| {
        Schedule::from_steps(
            [
                (
                    Op::Send {
                        to: peer,
                        src: out(0, 4),
                    },
                    vec![],
                ),
                (
                    Op::Recv {
                        from: peer,
                        dst: out(0, 4),
                    },
                    vec![0],
                ),
            ],
            0,
        )
    };
    assert!(run(&[ok(1), ok(0)], SimConfig::default()).is_ok());
}

#[test]
fn zero_link_buffer_is_refused() {
    let config = SimConfig {
        link_buffer: 0,
        ..SimConfig::default()
    };
    assert!(matches!(
        run(&[Schedule::default()], config),
        Err(SimError::Shape(_))
    ));
}

/// Placed on hosts, a message between hosts travels under the remote model, and ranks of one
/// host share its memory bus: two transfers at once take turns there, while ranks of
/// different hosts send at the same time.
#[test]
fn ranks_on_hosts_price_remote_links_apart_and_share_a_hosts_bus() {
    use oxccl::algo::Hosts;
    use oxccl::algo::sim::LinkModel;
    let exchange = |peer| {
        Schedule::from_steps(
            [
                (
                    Op::Send {
                        to: peer,
                        src: input(0, 1000),
                    },
                    vec![],
                ),
                (
                    Op::Recv {
                        from: peer,
                        dst: out(0, 1000),
                    },
                    vec![],
                ),
            ],
            0,
        )
    };
    let schedules = [exchange(1), exchange(0)];
    let local = LinkModel::new(1e-6, 1e9); // 1 µs + 1 ns/B
    let remote = LinkModel::new(10e-6, 1e8); // 10 µs + 10 ns/B
    let config = SimConfig {
        model: local,
        ..SimConfig::default()
    };
    let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
    // Two hosts: each direction at once under the remote model.
    let apart = sim::price_across(&schedules, DataType::U8, &config, &Hosts::flat(2), remote)
        .unwrap()
        .time;
    assert!(close(apart, 10e-6 + 1000.0 * 10e-9), "{apart}");
    // One host: the two transfers take turns on its bus.
    let together = sim::price_across(&schedules, DataType::U8, &config, &Hosts::single(2), remote)
        .unwrap()
        .time;
    assert!(close(together, 1e-6 + 2000.0 * 1e-9), "{together}");
    // Unless the model says its links are not the bus (TCP between ranks of one host: each
    // rank's own ports, as between hosts).
    let own_ports = SimConfig {
        model: LinkModel {
            bus: false,
            ..local
        },
        ..SimConfig::default()
    };
    let together = sim::price_across(
        &schedules,
        DataType::U8,
        &own_ports,
        &Hosts::single(2),
        remote,
    )
    .unwrap()
    .time;
    assert!(close(together, 1e-6 + 1000.0 * 1e-9), "{together}");
    // Two ranks of a host sending to two of another at once take turns on its card.
    let to = |peer| {
        Schedule::from_steps(
            [(
                Op::Send {
                    to: peer,
                    src: input(0, 1000),
                },
                vec![],
            )],
            0,
        )
    };
    let from = |peer| {
        Schedule::from_steps(
            [(
                Op::Recv {
                    from: peer,
                    dst: out(0, 1000),
                },
                vec![],
            )],
            0,
        )
    };
    let crossing = [to(2), to(3), from(0), from(1)];
    let two_by_two = Hosts::from_labels(&[0, 0, 1, 1]);
    let t = sim::price_across(&crossing, DataType::U8, &config, &two_by_two, remote)
        .unwrap()
        .time;
    assert!(close(t, 10e-6 + 2000.0 * 10e-9), "{t}");
    // Without hosts, every rank has its own ports.
    let plain = sim::price(&schedules, DataType::U8, &config).unwrap().time;
    assert!(close(plain, 1e-6 + 1000.0 * 1e-9), "{plain}");
    // The hosts must place every rank.
    assert!(matches!(
        sim::price_across(&schedules, DataType::U8, &config, &Hosts::flat(3), remote),
        Err(SimError::Shape(_))
    ));
}

#[test]
fn a_ranks_messages_take_turns_on_its_processor_for_the_overhead() {
    use oxccl::algo::sim::LinkModel;
    // Rank 0 sends a byte to ranks 1, 2 and 3 (fan-out), then the same the other way (fan-in).
    let send = |to| {
        (
            Op::Send {
                to,
                src: input(0, 1),
            },
            vec![],
        )
    };
    let recv = |from, at| {
        (
            Op::Recv {
                from,
                dst: out(at, 1),
            },
            vec![],
        )
    };
    let fan_out = [
        Schedule::from_steps([send(1), send(2), send(3)], 0),
        Schedule::from_steps([recv(0, 0)], 0),
        Schedule::from_steps([recv(0, 0)], 0),
        Schedule::from_steps([recv(0, 0)], 0),
    ];
    let fan_in = [
        Schedule::from_steps([recv(1, 0), recv(2, 1), recv(3, 2)], 0),
        Schedule::from_steps([send(0)], 0),
        Schedule::from_steps([send(0)], 0),
        Schedule::from_steps([send(0)], 0),
    ];
    let config = |overhead| SimConfig {
        link_buffer: 1,
        check_races: true,
        model: LinkModel {
            overhead,
            ..LinkModel::new(1e-6, 1e15)
        },
    };
    let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
    for schedules in [&fan_out, &fan_in] {
        // Without overhead the three messages travel at once: α.
        let t = run(schedules, config(0.0)).unwrap().time;
        assert!(close(t, 1e-6), "{t}");
        // With it, the third is handed over (or taken in) after the other two: 3·o + α + o.
        let t = run(schedules, config(0.5e-6)).unwrap().time;
        assert!(close(t, 3e-6), "{t}");
    }
}
