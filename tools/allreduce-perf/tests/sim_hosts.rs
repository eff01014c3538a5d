//! allreduce-perf on simulated hosts (tools/sim-hosts/hosts.sh: each host its own network and
//! UTS namespace and its own /dev/shm, ranks started with torchrun's variables): 2 hosts × 2
//! ranks, 3 hosts × 1 rank, and hosts of 2 + 1 ranks. Every collective is checked against the
//! benchmark's reference (exit status 0, no wrong element), the rank lines show the hosts and
//! the links (shared memory inside a host, TCP between hosts), and the tuner — pricing TCP
//! as a 10 Gb/s network (a cost table in OXCCL_TUNE_FILE: the simulated hosts' unshaped links
//! are loopback-fast) — takes the hierarchical route only where ranks both span hosts and
//! share them, and for the all-reduce, all-gather and reduce-scatter on hosts of equal size.
//!
//! Needs root, iproute2 and bash ≥ 5.1; elsewhere each test says "skipped: <reason>", unless
//! OXCCL_REQUIRE_SIMHOSTS is set (as CI does), which makes that a failure.

mod util;

use std::path::PathBuf;
use std::process::Command;

/// Why simulated hosts cannot run here, if they cannot.
fn unavailable() -> Option<String> {
    let id = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&id.stdout).trim() != "0" {
        return Some("simulated hosts need root (network namespaces)".into());
    }
    for tool in ["ip", "tc", "unshare", "nsenter", "setsid"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            return Some(format!(
                "simulated hosts need {tool} (iproute2, util-linux)"
            ));
        }
    }
    None
}

/// Whether to go on: false (after saying why) when simulated hosts cannot run here and CI
/// does not require them.
fn can_run() -> bool {
    match unavailable() {
        None => true,
        Some(why) if std::env::var_os("OXCCL_REQUIRE_SIMHOSTS").is_some() => {
            panic!("OXCCL_REQUIRE_SIMHOSTS is set but {why}")
        }
        Some(why) => {
            println!("skipped: {why}");
            false
        }
    }
}

fn hosts_sh() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../sim-hosts/hosts.sh")
}

/// A rank's command: torchrun's variables from hosts.sh's, `SIM_SKIP` ("host:local") naming a
/// slot that runs no rank (so 2 hosts × 2 slots make hosts of 2 + 1 ranks).
const RANK: &str = r#"
if [ "$SIM_HOST_INDEX:$SIM_LOCAL_RANK" = "$SIM_SKIP" ]; then exit 0; fi
export RANK=$SIM_RANK WORLD_SIZE=$SIM_WORLD LOCAL_RANK=$SIM_LOCAL_RANK
export LOCAL_WORLD_SIZE=$SIM_RANKS_PER_HOST MASTER_ADDR=$SIM_MASTER_ADDR MASTER_PORT=29500
exec "$0" "$@"
"#;

/// Runs allreduce-perf on `hosts` hosts of `slots` ranks (less the `skip` slot) measuring
/// `collective`; returns rank 0's output after checking the exit status.
fn run(hosts: usize, slots: usize, skip: Option<(usize, usize)>, collective: &str) -> String {
    let args = [
        "-o", collective, "-b", "8", "-e", "2M", "-f", "8", "-n", "2", "-w", "1", "-c", "1", "-r",
        "1", "-T", "60",
    ];
    perf(hosts, slots, skip, &args)
}

/// Runs allreduce-perf with `args` on `hosts` hosts of `slots` ranks (less the `skip` slot);
/// returns rank 0's output after checking the exit status.
fn perf(hosts: usize, slots: usize, skip: Option<(usize, usize)>, args: &[&str]) -> String {
    let collective = args.join(" ");
    let world = hosts * slots - usize::from(skip.is_some());
    let (n, r) = (hosts.to_string(), slots.to_string());
    let out = Command::new("bash")
        .arg(hosts_sh())
        // The machine's boot id: the simulated hosts share its cores, which oxccl tells by the
        // kernel they run under (with a boot id of their own, ranks looked roomy and spun).
        .args(["-n", &n, "-r", &r, "-q", "--real-boot-id", "-t", "120"])
        .args(["--", "sh", "-c", RANK, env!("CARGO_BIN_EXE_allreduce-perf")])
        .args(args)
        .env("SIM_WORLD", world.to_string())
        .env("OXCCL_TUNE_FILE", network_costs(world))
        .env(
            "SIM_SKIP",
            skip.map_or(String::new(), |(h, l)| format!("{h}:{l}")),
        )
        .output()
        .expect("run hosts.sh");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{collective} on {hosts} hosts × {slots} (skipping {skip:?}) failed ({}):\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// A cost table for `world` ranks: the defaults, with TCP priced as a 10 Gb/s network (20 µs
/// a message, 1.25 GB/s).
fn network_costs(world: usize) -> PathBuf {
    use oxccl::tune::{Costs, LinkCost, LinkKind};
    let costs = Costs::defaults().clone().with_link(
        LinkKind::Tcp,
        LinkCost {
            alpha: 20e-6,
            beta: 0.8e-9,
            stream: None,
        },
    );
    let text = costs
        .to_text()
        .replace("\nranks 2\n", &format!("\nranks {world}\n"));
    let path = std::env::temp_dir().join(format!(
        "oxccl-simhosts-{}-{world}r.txt",
        std::process::id()
    ));
    std::fs::write(&path, text).expect("cost table");
    path
}

/// The rank lines of an allreduce-perf table (`#  Rank  0 Group ...`).
fn rank_lines(text: &str) -> Vec<&str> {
    text.lines().filter(|l| l.starts_with("#  Rank")).collect()
}

/// Every collective on the layout; `host_of[r]` is rank r's host.
fn check_layout(hosts: usize, slots: usize, skip: Option<(usize, usize)>, host_of: &[usize]) {
    let n = host_of.len();
    let shared = (0..n).any(|a| (0..n).any(|b| a != b && host_of[a] == host_of[b]));
    let on = |h: usize| host_of.iter().filter(|&&x| x == h).count();
    let even = host_of.iter().all(|&h| on(h) == on(host_of[0]));
    // The discovered topology shows the hosts, their NICs and which ranks run where.
    let topo = perf(hosts, slots, skip, &["--topo"]);
    assert!(
        topo.starts_with(&format!("topology: {n} ranks on {hosts} hosts\n")),
        "{topo}"
    );
    for h in 0..hosts {
        let ranks: Vec<String> = (0..n)
            .filter(|&r| host_of[r] == h)
            .map(|r| r.to_string())
            .collect();
        let line = format!("host {h} simhost{h} (simhost{h}-");
        assert!(topo.contains(&line), "{line}: {topo}");
        assert!(
            topo.contains(&format!("): ranks {}\n", ranks.join(" "))),
            "{topo}"
        );
        let nic = format!("  nic eth0: 10.231.0.{}; 10000 Mbit/s;", h + 1);
        assert!(topo.contains(&nic), "{nic}: {topo}");
    }
    for collective in [
        "allreduce",
        "broadcast",
        "reduce",
        "allgather",
        "reducescatter",
        "alltoall",
        "gather",
        "scatter",
    ] {
        let text = run(hosts, slots, skip, collective);
        let lines = rank_lines(&text);
        assert_eq!(lines.len(), n, "{collective}: rank lines\n{text}");
        for (r, line) in lines.iter().enumerate() {
            let host = format!(" on   simhost{} ", host_of[r]);
            assert!(line.contains(&host), "rank {r} should run {host}: {line}");
            let alone = host_of.iter().filter(|&&h| h == host_of[r]).count() == 1;
            // The line lists the transports in the order of the rank's links.
            let links: &[&str] = if alone {
                &["[cpu] tcp;"]
            } else {
                &["shm,tcp;", "tcp,shm;"]
            };
            assert!(
                links.iter().any(|l| line.contains(l)),
                "rank {r} should link over {links:?}: {line}"
            );
            if !shared {
                assert!(
                    !line.contains("hierarchical"),
                    "{collective}, rank {r}: {line}"
                );
            } else if even && matches!(collective, "allreduce" | "allgather" | "reducescatter") {
                assert!(
                    line.contains("hierarchical"),
                    "{collective}, rank {r}: {line}"
                );
            }
        }
    }
}

#[test]
fn two_hosts_of_two_ranks() {
    if can_run() {
        check_layout(2, 2, None, &[0, 0, 1, 1]);
    }
}

#[test]
fn three_hosts_of_one_rank() {
    if can_run() {
        check_layout(3, 1, None, &[0, 1, 2]);
    }
}

#[test]
fn hosts_of_two_and_one_ranks() {
    if can_run() {
        check_layout(2, 2, Some((1, 1)), &[0, 0, 1]);
    }
}
