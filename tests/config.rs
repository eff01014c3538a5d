//! Bad configuration is an error, never a panic or a hang: every `OXCCL_*` variable and every
//! builder method, with the values users get wrong (issue 11, point 4), and a property test
//! over `Config::from_vars` with arbitrary strings whose accepted configurations run a
//! collective.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use oxccl::bootstrap::UniqueId;
use oxccl::config::TransportFilter;
use oxccl::{Communicator, Config, Error, ReduceOp};
use proptest::prelude::*;
use proptest::sample::{select, subsequence};

/// Every variable `Config::from_vars` reads.
const VARS: [&str; 17] = [
    "OXCCL_TIMEOUT",
    "OXCCL_ALGO",
    "OXCCL_TRANSPORTS",
    "OXCCL_SOCKET_IFNAME",
    "OXCCL_HOST_ID",
    "OXCCL_SLICE_BYTES",
    "OXCCL_SCRATCH_SLOTS",
    "OXCCL_DIRECT_MIN",
    "OXCCL_DIRECT_MAX",
    "OXCCL_DIRECT_COPY_MIN",
    "OXCCL_AREA_WAY",
    "OXCCL_TUNE",
    "OXCCL_TRACE_ENTRIES",
    "OXCCL_TRACE_DIR",
    "OXCCL_TRACE_SIGNAL",
    "OXCCL_HEARTBEAT",
    "OXCCL_NVML_LIBRARY",
];

/// Longer than anything here should take: past it, the call hangs.
const PATIENCE: Duration = Duration::from_secs(60);

/// Runs `f` on its own thread and returns its result; fails the test when `f` panics or has not
/// returned within [`PATIENCE`].
fn answers<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(PATIENCE) {
        Ok(t) => t,
        Err(RecvTimeoutError::Disconnected) => panic!("{what}: panicked"),
        Err(RecvTimeoutError::Timeout) => panic!("{what}: no answer after {PATIENCE:?}"),
    }
}

fn from_pairs(pairs: &[(&str, String)]) -> oxccl::Result<Config> {
    Config::from_vars(|k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()))
}

/// Creates two local ranks with `config` and all-reduces a few floats on them; the error of
/// creation or of either rank's call, if any.
fn all_reduce_on_two(config: Config) -> oxccl::Result<()> {
    let comms = Communicator::init_local(2, config)?;
    let results = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let r = c.rank() as f32;
                    let send: Vec<f32> = (1..=5).map(|i| i as f32 * (r + 1.0)).collect();
                    let mut recv = vec![0f32; 5];
                    c.all_reduce(&send, &mut recv, ReduceOp::Sum).map(|()| recv)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect::<Vec<_>>()
    });
    for recv in results {
        let want: Vec<f32> = (1..=5).map(|i| i as f32 * 3.0).collect();
        assert_eq!(recv?, want);
    }
    Ok(())
}

#[test]
fn the_nvml_library_is_named_or_turned_off() {
    let nvml = |v: Option<&str>| {
        let pairs: Vec<(&str, String)> = v
            .map(|v| ("OXCCL_NVML_LIBRARY", v.to_owned()))
            .into_iter()
            .collect();
        from_pairs(&pairs).unwrap().nvml_library
    };
    let default = Some(std::path::PathBuf::from("libnvidia-ml.so.1"));
    assert_eq!(nvml(None), default);
    assert_eq!(nvml(Some(" ")), default);
    assert_eq!(nvml(Some("none")), None);
    assert_eq!(nvml(Some(" Off ")), None);
    assert_eq!(
        nvml(Some(" /opt/nv/libnvidia-ml.so.1 ")),
        Some("/opt/nv/libnvidia-ml.so.1".into())
    );
}

#[test]
fn bad_variables_are_errors_naming_the_variable() {
    let huge = "1".repeat(400);
    for (var, value) in [
        ("OXCCL_TIMEOUT", "1e20"),
        ("OXCCL_TIMEOUT", "1e10"),
        ("OXCCL_TIMEOUT", "31536001"),
        ("OXCCL_TIMEOUT", &huge),
        ("OXCCL_TIMEOUT", "-1"),
        ("OXCCL_TIMEOUT", "-0.001"),
        ("OXCCL_TIMEOUT", "NaN"),
        ("OXCCL_TIMEOUT", "inf"),
        ("OXCCL_TIMEOUT", "-inf"),
        ("OXCCL_TIMEOUT", "0"),
        ("OXCCL_TIMEOUT", "0.0"),
        ("OXCCL_TIMEOUT", "1e-9"),
        ("OXCCL_TIMEOUT", "soon"),
        ("OXCCL_TIMEOUT", ""),
        ("OXCCL_TIMEOUT", "10s"),
        ("OXCCL_SLICE_BYTES", "0"),
        ("OXCCL_SLICE_BYTES", "63"),
        ("OXCCL_SLICE_BYTES", "67108865"),
        ("OXCCL_SLICE_BYTES", "18446744073709551615"),
        ("OXCCL_SLICE_BYTES", "18446744073709551616"),
        ("OXCCL_SLICE_BYTES", "-64"),
        ("OXCCL_SLICE_BYTES", "64k"),
        ("OXCCL_SCRATCH_SLOTS", "0"),
        ("OXCCL_SCRATCH_SLOTS", "65"),
        ("OXCCL_SCRATCH_SLOTS", "-1"),
        ("OXCCL_SCRATCH_SLOTS", "many"),
        ("OXCCL_ALGO", "bogus"),
        ("OXCCL_ALGO", "ring,tree"),
        ("OXCCL_TRANSPORTS", "carrier-pigeon"),
        ("OXCCL_TRANSPORTS", "shm,pigeon"),
        ("OXCCL_TRANSPORTS", "tcp,tcp"),
        ("OXCCL_TRANSPORTS", "^loopback,shm,rdma,tcp"),
        ("OXCCL_TRANSPORTS", ""),
        ("OXCCL_TRANSPORTS", ",,"),
        ("OXCCL_HOST_ID", &"h".repeat(Config::MAX_HOST_ID_BYTES + 1)),
        ("OXCCL_DIRECT_MIN", "-1"),
        ("OXCCL_DIRECT_MIN", "on"),
        ("OXCCL_DIRECT_MIN", "18446744073709551616"),
        ("OXCCL_DIRECT_MAX", "off"),
        ("OXCCL_DIRECT_MAX", "1e6"),
    ] {
        match from_pairs(&[(var, value.to_string())]) {
            Err(e @ Error::InvalidArgument(_)) => {
                assert!(e.to_string().contains(var), "{var}={value:?}: {e}")
            }
            other => panic!("{var}={value:?}: want an invalid-argument error, got {other:?}"),
        }
    }
}

#[test]
fn bad_builder_values_make_creation_fail_naming_the_field() {
    let default = Config::default().transports(TransportFilter::only(&["loopback"]));
    for (field, config) in [
        ("timeout", default.clone().timeout(Duration::ZERO)),
        (
            "timeout",
            default.clone().timeout(Duration::from_micros(999)),
        ),
        ("timeout", default.clone().timeout(Duration::MAX)),
        (
            "timeout",
            default.clone().timeout(Duration::from_secs(u64::MAX)),
        ),
        ("slice_bytes", default.clone().slice_bytes(0)),
        ("slice_bytes", default.clone().slice_bytes(usize::MAX)),
        ("scratch_slots", default.clone().scratch_slots(0)),
        ("scratch_slots", default.clone().scratch_slots(usize::MAX)),
        (
            "transports",
            default.clone().transports(TransportFilter::only(&[])),
        ),
        (
            "transports",
            default
                .clone()
                .transports(TransportFilter::only(&["pigeon"])),
        ),
        (
            "transports",
            default
                .clone()
                .transports(TransportFilter::only(&["loopback", "loopback"])),
        ),
    ] {
        let what = format!("init_local with {field} = {config:?}");
        let got = answers(&what, move || {
            Communicator::init_local(2, config).map(|comms| comms.len())
        });
        match got {
            Err(e @ Error::InvalidArgument(_)) => {
                assert!(e.to_string().contains(field), "{what}: {e}")
            }
            other => panic!("{what}: want an invalid-argument error, got {other:?}"),
        }
    }
}

#[test]
fn init_rank_rejects_a_bad_config_before_connecting() {
    let id = UniqueId::new().expect("unique id");
    for config in [
        Config::default().timeout(Duration::MAX),
        Config::default().slice_bytes(0),
    ] {
        let what = format!("init_rank with {config:?}");
        let id = id.clone();
        let got = answers(&what, move || {
            Communicator::init_rank(&id, 1, 0, config).map(|c| c.size())
        });
        assert!(
            matches!(got, Err(Error::InvalidArgument(_))),
            "{what}: {got:?}"
        );
    }
}

#[test]
fn sizes_no_job_has_are_refused_before_anything_is_reserved() {
    // Creation reserves per-rank state before it hears from a peer: a size past the bound
    // (a garbled WORLD_SIZE, a C caller's INT_MAX) is an invalid argument, promptly, not an
    // allocation of gigabytes.
    let id = UniqueId::new().expect("unique id");
    let config = Config::default().timeout(Duration::from_secs(5));
    for n in [oxccl::MAX_RANKS + 1, i32::MAX as usize, usize::MAX] {
        let (id, config) = (id.clone(), config.clone());
        let what = format!("init_rank of {n} ranks");
        let got = answers(&what, move || {
            Communicator::init_rank(&id, n, 0, config).map(|c| c.size())
        });
        match got {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("1048576"), "{what}: {m}"),
            other => panic!("{what}: {other:?}"),
        }
    }
    for n in [oxccl::MAX_LOCAL_RANKS + 1, usize::MAX] {
        match Communicator::init_local(n, config.clone()) {
            Err(Error::InvalidArgument(m)) => {
                assert!(m.contains(&oxccl::MAX_LOCAL_RANKS.to_string()), "{n}: {m}")
            }
            other => panic!("init_local({n}): {:?}", other.map(|v| v.len())),
        }
    }
}

#[test]
fn the_ends_of_every_range_run_a_collective() {
    let loopback = Config::default().transports(TransportFilter::only(&["loopback"]));
    for config in [
        loopback
            .clone()
            .timeout(Config::MAX_TIMEOUT)
            .slice_bytes(Config::MIN_SLICE_BYTES)
            .scratch_slots(1)
            .direct_min(0)
            .direct_max(0),
        loopback
            .clone()
            .timeout(Duration::from_secs(10))
            .slice_bytes(Config::MAX_SLICE_BYTES)
            .scratch_slots(Config::MAX_SCRATCH_SLOTS)
            .direct_min(usize::MAX)
            .direct_max(usize::MAX),
    ] {
        let what = format!("all_reduce with {config:?}");
        answers(&what, move || all_reduce_on_two(config)).unwrap_or_else(|e| panic!("{what}: {e}"));
    }
}

/// Whether a generated value is one the variable accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Absent,
    Valid,
    Invalid,
    /// Any string: accepted or not.
    Arbitrary,
}

fn strings(values: &[&'static str]) -> BoxedStrategy<String> {
    select(values.to_vec()).prop_map(str::to_owned).boxed()
}

/// Values `var` accepts.
fn valid(var: &'static str) -> BoxedStrategy<String> {
    match var {
        "OXCCL_TIMEOUT" => prop_oneof![
            (1u64..=31_536_000).prop_map(|s| s.to_string()),
            (0.001f64..=1000.0).prop_map(|s| s.to_string()),
            strings(&["0.001", " 2.5 ", "1e3", "31536000", "300.0"]),
        ]
        .boxed(),
        "OXCCL_ALGO" => strings(&[
            "ring",
            "tree",
            "hd",
            "direct",
            "Ring",
            " TREE ",
            "halving_doubling",
            "rabenseifner",
            "one-shot",
            "pairwise",
            "",
            "  ",
        ]),
        "OXCCL_TRANSPORTS" => prop_oneof![
            (
                subsequence(TransportFilter::KNOWN.to_vec(), 1..=4),
                any::<bool>()
            )
                .prop_map(|(names, reversed)| {
                    let mut names = names;
                    if reversed {
                        names.reverse();
                    }
                    names.join(",")
                }),
            subsequence(TransportFilter::KNOWN.to_vec(), 0..=3)
                .prop_map(|names| format!("^{}", names.join(","))),
            strings(&[" Shm , TCP ", "loopback,", "^ rdma"]),
        ]
        .boxed(),
        "OXCCL_SOCKET_IFNAME" => prop_oneof![
            any::<String>(),
            strings(&["eth0", "^docker,lo", "=eth0", "ib"]),
        ]
        .boxed(),
        // Blank ones mean "not set"; proptest's strings are far below the length limit.
        "OXCCL_HOST_ID" => prop_oneof![any::<String>(), strings(&["node7", " ", ""])].boxed(),
        "OXCCL_SLICE_BYTES" => prop_oneof![
            (64usize..=64 << 20).prop_map(|b| b.to_string()),
            strings(&["64", "67108864", " 65536 ", "+4096"]),
        ]
        .boxed(),
        "OXCCL_SCRATCH_SLOTS" => (1usize..=64).prop_map(|s| s.to_string()).boxed(),
        "OXCCL_DIRECT_MIN" => prop_oneof![
            any::<usize>().prop_map(|b| b.to_string()),
            strings(&["off", "OFF", " off ", "0"]),
        ]
        .boxed(),
        "OXCCL_DIRECT_MAX" => any::<usize>().prop_map(|b| b.to_string()).boxed(),
        "OXCCL_DIRECT_COPY_MIN" => prop_oneof![
            any::<usize>().prop_map(|b| b.to_string()),
            strings(&["off", "Off", "0"]),
        ]
        .boxed(),
        "OXCCL_AREA_WAY" => strings(&["one-shot", "TWO-SHOT", " direct ", "staged", ""]),
        // `calibrate` and `probe` are left to tests/tuner.rs and allreduce-perf's tests/probe.rs:
        // each case would measure for a second.
        "OXCCL_TUNE" => strings(&["defaults", "cache", " Cache ", ""]),
        "OXCCL_TRACE_ENTRIES" => prop_oneof![
            (0usize..=oxccl::trace::MAX_ENTRIES).prop_map(|n| n.to_string()),
            strings(&["0", "2000", " 16 "]),
        ]
        .boxed(),
        "OXCCL_TRACE_DIR" => strings(&["", "/tmp/oxccl-trace-config-test"]),
        "OXCCL_NVML_LIBRARY" => strings(&[
            "",
            "none",
            " OFF ",
            "libnvidia-ml.so.1",
            "/nonexistent/libnvidia-ml.so.1",
        ]),
        "OXCCL_TRACE_SIGNAL" => strings(&["0", "1", "off", " ON ", "no", ""]),
        "OXCCL_HEARTBEAT" => prop_oneof![
            (0.1f64..100.0).prop_map(|s| s.to_string()),
            strings(&["0", "off", " OFF ", "2", ""]),
        ]
        .boxed(),
        _ => unreachable!("{var}"),
    }
}

/// Values `var` rejects.
fn invalid(var: &'static str) -> BoxedStrategy<String> {
    let numbers = &[
        "",
        " ",
        "-1",
        "1e6",
        "0x10",
        "NaN",
        "lots",
        "18446744073709551616",
    ];
    match var {
        "OXCCL_TIMEOUT" => prop_oneof![
            (31_536_001u64..).prop_map(|s| s.to_string()),
            (-1e300f64..=0.0).prop_map(|s| s.to_string()),
            strings(&[
                "0", "-0", "0.0009", "1e20", "1e400", "nan", "inf", "-inf", "soon", "", "10s",
            ]),
        ]
        .boxed(),
        "OXCCL_ALGO" => strings(&["bogus", "auto", "ring,tree", "rings"]),
        "OXCCL_TRANSPORTS" => strings(&[
            "",
            ",",
            "pigeon",
            "shm,pigeon",
            "tcp,shm,tcp",
            "^loopback,shm,rdma,tcp",
            "^pigeon",
        ]),
        "OXCCL_HOST_ID" => Just("h".repeat(Config::MAX_HOST_ID_BYTES + 1)).boxed(),
        "OXCCL_SLICE_BYTES" => prop_oneof![
            (0usize..64).prop_map(|b| b.to_string()),
            ((64usize << 20) + 1..).prop_map(|b| b.to_string()),
            strings(numbers),
        ]
        .boxed(),
        "OXCCL_SCRATCH_SLOTS" => prop_oneof![
            (65usize..).prop_map(|b| b.to_string()),
            strings(&["0"]),
            strings(numbers),
        ]
        .boxed(),
        "OXCCL_DIRECT_MIN" => strings(numbers),
        "OXCCL_DIRECT_MAX" => strings(&["off", "-1", "1e6", "lots", ""]),
        "OXCCL_DIRECT_COPY_MIN" => strings(numbers),
        "OXCCL_AREA_WAY" => strings(&["fast", "one_shot", "ring", "shm direct"]),
        "OXCCL_TUNE" => strings(&["yes", "calibrated", "0", "off"]),
        "OXCCL_TRACE_ENTRIES" => prop_oneof![
            (oxccl::trace::MAX_ENTRIES + 1..).prop_map(|n| n.to_string()),
            strings(numbers),
        ]
        .boxed(),
        "OXCCL_TRACE_SIGNAL" => strings(&["maybe", "2", "-", "offf"]),
        "OXCCL_HEARTBEAT" => strings(&["0.01", "-1", "nan", "inf", "1e20", "soon", "2s"]),
        // Any interface list is accepted (a list that matches nothing fails at creation).
        _ => unreachable!("{var}"),
    }
}

/// Anything: printable strings, strings of number-ish characters, and any chars at all.
fn arbitrary() -> BoxedStrategy<String> {
    prop_oneof![
        any::<String>(),
        "[-+0-9eE.xnaNAifINF, ^]{0,12}",
        "[a-zA-Z,^ ]{0,16}",
    ]
    .boxed()
}

/// One value, or none, per variable, with what it is.
fn environment(with_bad: bool) -> impl Strategy<Value = Vec<(&'static str, Kind, Option<String>)>> {
    VARS.iter()
        .map(move |&var| {
            let absent = Just((var, Kind::Absent, None)).boxed();
            let valid = valid(var).prop_map(move |v| (var, Kind::Valid, Some(v)));
            if !with_bad {
                return prop_oneof![1 => absent, 2 => valid].boxed();
            }
            let arbitrary = arbitrary().prop_map(move |v| (var, Kind::Arbitrary, Some(v)));
            // Any interface list, directory and library are accepted.
            if var == "OXCCL_SOCKET_IFNAME"
                || var == "OXCCL_TRACE_DIR"
                || var == "OXCCL_NVML_LIBRARY"
            {
                return prop_oneof![3 => absent, 3 => valid, 2 => arbitrary].boxed();
            }
            let invalid = invalid(var).prop_map(move |v| (var, Kind::Invalid, Some(v)));
            prop_oneof![6 => absent, 6 => valid, 1 => invalid, 2 => arbitrary].boxed()
        })
        .collect::<Vec<_>>()
}

fn parse(env: &[(&'static str, Kind, Option<String>)]) -> oxccl::Result<Config> {
    let pairs: Vec<(&str, String)> = env
        .iter()
        .filter_map(|(var, _, v)| Some((*var, v.clone()?)))
        .collect();
    from_pairs(&pairs)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// `from_vars` never panics; it accepts what is valid, rejects what is not, and an error
    /// names a variable that was set to something that may be wrong.
    #[test]
    fn from_vars_never_panics_and_names_the_bad_variable(env in environment(true)) {
        let kinds = |k: Kind| env.iter().filter(move |e| e.1 == k).map(|e| e.0);
        match parse(&env) {
            Ok(c) => {
                prop_assert!(c.validate().is_ok(), "accepted but invalid: {c:?}");
                prop_assert_eq!(kinds(Kind::Invalid).next(), None, "accepted: {:?}", env);
            }
            Err(e) => {
                let e = e.to_string();
                let suspects: Vec<&str> = kinds(Kind::Invalid).chain(kinds(Kind::Arbitrary)).collect();
                prop_assert!(
                    suspects.iter().any(|v| e.contains(v)),
                    "{e} names none of {suspects:?} ({env:?})"
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Every accepted configuration creates a communicator that all-reduces correctly (over
    /// in-process queues, without the host's interfaces or identity, with a deadline of at
    /// most 10 s).
    #[test]
    fn accepted_configurations_run_a_collective(env in environment(false)) {
        let config = parse(&env).map_err(|e| TestCaseError::fail(format!("{e} ({env:?})")))?;
        let config = Config {
            socket_ifname: None,
            host_id: None,
            // A deadline of a few milliseconds is honoured, and may pass on a loaded machine.
            timeout: config.timeout.clamp(Duration::from_secs(1), Duration::from_secs(10)),
            ..config
        }
        .transports(TransportFilter::only(&["loopback"]));
        let what = format!("{config:?}");
        let got = answers(&what, move || all_reduce_on_two(config));
        prop_assert!(got.is_ok(), "{what}: {got:?}");
    }
}
