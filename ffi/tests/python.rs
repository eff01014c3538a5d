//! A Python ctypes smoke test of liboxccl.so (tests/python/smoke.py): versions, ids, error
//! strings and messages, and a 1-rank communicator's all-reduce on a ctypes array.

mod util;

use std::path::Path;
use std::process::Command;

#[test]
fn python_calls_the_library_through_ctypes() {
    if !util::have("python3", util::REQUIRE_CC) {
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/smoke.py");
    let version = [
        env!("CARGO_PKG_VERSION_MAJOR"),
        env!("CARGO_PKG_VERSION_MINOR"),
        env!("CARGO_PKG_VERSION_PATCH"),
    ]
    .map(|p| p.parse::<u32>().expect("a number"));
    let code = version[0] * 10000 + version[1] * 100 + version[2];
    let out = util::succeed(
        Command::new("python3")
            .arg(&script)
            .arg(util::libraries().join("liboxccl.so"))
            .arg(code.to_string())
            .env("OXCCL_TIMEOUT", "60"),
        "the ctypes smoke test",
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.lines().any(|l| l == "ok"), "no \"ok\":\n{stdout}");
}
