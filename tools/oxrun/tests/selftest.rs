//! Ranks as separate processes: `oxrun -n N` runs oxccl's `selftest` example (every collective
//! on several types and sizes, each rank checking its own results) over TCP between processes.

use std::path::PathBuf;
use std::process::Command;

/// The `selftest` example of the oxccl package, built if `cargo test` did not build it already.
fn selftest() -> PathBuf {
    let oxrun = PathBuf::from(env!("CARGO_BIN_EXE_oxrun"));
    let dir = oxrun.parent().expect("target dir");
    let exe = dir.join("examples").join("selftest");
    if !exe.exists() {
        let status = Command::new(env!("CARGO"))
            .args(["build", "-p", "oxccl", "--example", "selftest"])
            .status()
            .expect("run cargo");
        assert!(status.success(), "building the selftest example failed");
    }
    assert!(exe.exists(), "no selftest example at {}", exe.display());
    exe
}

fn run(n: usize, env: &[(&str, &str)]) {
    let out = Command::new(env!("CARGO_BIN_EXE_oxrun"))
        .args(["-n", &n.to_string(), "--timeout", "240", "--"])
        .arg(selftest())
        .envs(env.iter().copied())
        .output()
        .expect("run oxrun");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "oxrun failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    for r in 0..n {
        let tag = format!("[{r}] rank {r} of {n}: selftest ok");
        assert!(
            stdout.contains(&tag),
            "missing {tag:?} in:\n{stdout}\n{stderr}"
        );
    }
}

#[test]
fn three_processes_run_every_collective_over_tcp() {
    run(3, &[("OXCCL_TIMEOUT", "60")]);
}

#[test]
fn five_processes_with_each_forced_algorithm() {
    for algo in ["ring", "tree", "hd", "direct"] {
        run(
            5,
            &[
                ("OXCCL_TIMEOUT", "60"),
                ("OXCCL_ALGO", algo),
                ("OXCCL_SLICE_BYTES", "8192"),
            ],
        );
    }
}
