//! A C program (tests/c/basic.c) compiled against include/oxccl.h and liboxccl.so, run under
//! oxrun on 1, 2 and 4 ranks. Also checks the SONAME: the program finds the library only under
//! the name `liboxccl.so.0`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// target/<profile>, where this test binary's directory (deps/) lies.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    exe.parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf()
}

/// Builds `package` in this test's profile (a no-op when it is up to date): `cargo test` of this
/// crate builds neither liboxccl.so for linking nor oxrun, and a stale one would test old code.
fn build(dir: &Path, package: &str) {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["build", "-p", package]);
    if dir.file_name().is_some_and(|d| d == "release") {
        cmd.arg("--release");
    }
    let ok = cmd.status().expect("cargo").success();
    assert!(ok, "building {package} failed");
}

/// The compiled program, linked with `-loxccl` from a directory that has only liboxccl.so and
/// run from one that has only liboxccl.so.0; `None` without a C compiler.
fn compile() -> Option<PathBuf> {
    if Command::new("cc").arg("--version").output().is_err() {
        // CI installs one and sets this: there a missing compiler is a failure.
        assert!(
            std::env::var_os("OXCCL_REQUIRE_CC").is_none(),
            "no C compiler, and OXCCL_REQUIRE_CC is set"
        );
        println!("skipped: no C compiler");
        return None;
    }
    let target = target_dir();
    build(&target, "oxccl-ffi");
    let lib = target.join("liboxccl.so");
    let work = std::env::temp_dir().join(format!("oxccl-c-program-{}", std::process::id()));
    let (link, run) = (work.join("link"), work.join("run"));
    for d in [&link, &run] {
        std::fs::create_dir_all(d).expect("temp dir");
    }
    let _ = std::fs::remove_file(link.join("liboxccl.so"));
    let _ = std::fs::remove_file(run.join("liboxccl.so.0"));
    std::os::unix::fs::symlink(&lib, link.join("liboxccl.so")).expect("symlink");
    std::os::unix::fs::symlink(&lib, run.join("liboxccl.so.0")).expect("symlink");
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let exe = work.join("basic");
    let out = Command::new("cc")
        .args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-I"])
        .arg(manifest.join("../include"))
        .arg(manifest.join("tests/c/basic.c"))
        .arg("-o")
        .arg(&exe)
        .arg(format!("-L{}", link.display()))
        .arg("-loxccl")
        .arg(format!("-Wl,-rpath,{}", run.display()))
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "compiling tests/c/basic.c failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(exe)
}

fn oxrun(n: usize, exe: &Path) {
    let target = target_dir();
    build(&target, "oxrun");
    let out = Command::new(target.join("oxrun"))
        .args([
            "-n",
            &n.to_string(),
            "--timeout",
            "120",
            "--bind-to",
            "none",
        ])
        .arg(exe)
        .env("OXCCL_TIMEOUT", "60")
        .output()
        .expect("run oxrun");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{n} ranks: oxrun exited with {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    for r in 0..n {
        let want = format!("rank {r} of {n}: ok");
        assert!(
            stdout.lines().any(|l| l.contains(&want)),
            "{n} ranks: no {want:?} in the output\nstdout:\n{stdout}\nstderr:\n{stderr}"
        );
    }
}

#[test]
fn a_c_program_runs_under_oxrun() {
    let Some(exe) = compile() else { return };
    for n in [1, 2, 4] {
        oxrun(n, &exe);
    }
    let _ = std::fs::remove_dir_all(exe.parent().expect("work dir"));
}
