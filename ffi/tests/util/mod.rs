//! What the tests of the C libraries share (ffi/tests and, by path, nccl/tests): the tools they
//! need (a missing one skips a test, or fails it where CI says it must be there), the libraries
//! and oxrun built once per test process, and C programs compiled and linked the way a user of
//! this checkout does it (pkg-config).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// CI sets it: a missing C or C++ compiler, pkg-config or python3 fails the tests instead of
/// skipping them.
pub const REQUIRE_CC: &str = "OXCCL_REQUIRE_CC";
/// CI sets it: a missing mpicc or mpirun fails the tests instead of skipping.
pub const REQUIRE_MPI: &str = "OXCCL_REQUIRE_MPI";

/// The repository's root.
pub fn repo() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .expect("a crate of the workspace")
        .to_path_buf()
}

/// target/<profile>, where this test binary's directory (deps/) lies.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    exe.parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf()
}

/// Whether `tool` runs (`tool --version`); if not, says the test skipped, or fails when the
/// variable `require` is set.
pub fn have(tool: &str, require: &str) -> bool {
    if Command::new(tool).arg("--version").output().is_ok() {
        return true;
    }
    assert!(
        std::env::var_os(require).is_none(),
        "no {tool}, and {require} is set"
    );
    println!("skipped: no {tool}");
    false
}

/// An empty directory for this test process's files called `name`.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("oxccl-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Runs `cmd`, fails the test (with its output) unless it succeeds, and returns its output.
#[track_caller]
pub fn succeed(cmd: &mut Command, what: &str) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({:?}): {cmd:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The flags of C compilers in these tests: every warning, as an error.
pub const STRICT: [&str; 4] = ["-Wall", "-Wextra", "-Werror", "-pedantic"];

/// Compiles `source` (a C or C++ file, by its extension) with `compiler` as `std` and
/// [`STRICT`], without linking, looking for headers in `include`.
#[track_caller]
pub fn syntax_check(compiler: &str, std: &str, source: &Path, include: &[&Path]) {
    let mut cmd = Command::new(compiler);
    cmd.arg(format!("-std={std}"))
        .args(STRICT)
        .arg("-fsyntax-only");
    for dir in include {
        cmd.arg("-I").arg(dir);
    }
    succeed(
        cmd.arg(source),
        &format!("compiling {} as {std}", source.display()),
    );
}

/// target/<profile> with liboxccl.so and libnccl.so (their SONAME links and pkg-config files
/// beside them) and oxrun, built once per test process.
///
/// The build asks for what makes cargo pick the very units `cargo test --workspace` builds, so
/// that after that command it finds everything current (a build of the three packages alone
/// resolves features and profiles apart and compiles oxccl and its dependencies again: minutes
/// in CI): the profile of `cargo test` (test, or release with --release), every package, and a
/// target that needs dev-dependencies in each package that has them (the examples of oxccl and
/// of the TCP transport, ffi's header test; a package given dev-dependencies and no example
/// needs one here too, or this build gets slow again, not wrong).
pub fn libraries() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = target_dir();
        let profile = match dir.file_name().and_then(|d| d.to_str()) {
            Some("debug") => "test",
            Some(other) => other,
            None => panic!("no profile in {}", dir.display()),
        };
        // Targets: every library (the C ones among them) and binary (oxrun), and those that
        // need dev-dependencies (see above).
        let targets = ["--lib", "--bins", "--examples", "--test", "header"];
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "--profile", profile, "--workspace"])
            .args(targets);
        // Captured: cargo warns on every workspace build that two rlibs named liboxccl.rlib
        // (the main crate's and ffi's) are uplifted to one path, which none of this uses.
        succeed(cmd.current_dir(repo()), "building the libraries and oxrun");
        dir
    })
}

/// The compiler flags and libraries of `library` ("oxccl" or "nccl") from its pkg-config file.
pub fn pkg_config(library: &str) -> Vec<String> {
    let out = succeed(
        Command::new("pkg-config")
            .args(["--cflags", "--libs", library])
            .env("PKG_CONFIG_PATH", libraries()),
        &format!("pkg-config for {library}"),
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// `source` compiled with `compiler` (cc, mpicc) as C99 with [`STRICT`] and linked against
/// `library` with the flags of its pkg-config file, into `work`. It runs with the library found
/// only under `soname`, in a directory of its own ([`without_library_path`] keeps others out),
/// so it starts only if the library's SONAME is what the program asks for.
pub fn program(compiler: &str, source: &Path, library: &str, soname: &str, work: &Path) -> PathBuf {
    let flags = pkg_config(library);
    let run = work.join(format!("run-{library}"));
    std::fs::create_dir_all(&run).expect("run dir");
    let _ = std::fs::remove_file(run.join(soname));
    let lib = libraries().join(format!("lib{library}.so"));
    std::os::unix::fs::symlink(lib, run.join(soname)).expect("symlink");
    let exe = work.join(source.file_stem().expect("a file"));
    succeed(
        Command::new(compiler)
            .arg("-std=c99")
            .args(STRICT)
            .arg(source)
            .arg("-o")
            .arg(&exe)
            .args(flags)
            .arg(format!("-Wl,-rpath,{}", run.display())),
        &format!("compiling {}", source.display()),
    );
    exe
}

/// `cmd` without LD_LIBRARY_PATH, which `cargo test` points at target/<profile>/deps (where
/// every library lies under its file name): a program then finds its library only through
/// its run path.
pub fn without_library_path(cmd: &mut Command) -> &mut Command {
    cmd.env_remove("LD_LIBRARY_PATH")
}

/// Runs `launcher` (oxrun, mpirun: its arguments start `n` ranks of a test program, each of
/// which prints "rank R of N: ok" when all its checks hold) without LD_LIBRARY_PATH, and fails
/// unless it succeeds and every rank said so.
#[track_caller]
pub fn every_rank_ok(launcher: &mut Command, n: usize) {
    let what = format!("{n} ranks");
    let out = succeed(without_library_path(launcher), &what);
    let stdout = String::from_utf8_lossy(&out.stdout);
    for r in 0..n {
        let want = format!("rank {r} of {n}: ok");
        assert!(
            stdout.lines().any(|l| l.contains(&want)),
            "{what}: no {want:?} in the output\nstdout:\n{stdout}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
