//! A C program (tests/c/basic.c) compiled against include/oxccl.h and linked against
//! liboxccl.so with the flags of oxccl.pc, run under oxrun on 1, 2 and 4 ranks. It finds the
//! library only under the name `liboxccl.so.0`, its SONAME.

mod util;

use std::path::Path;
use std::process::Command;

use util::{REQUIRE_CC, every_rank_ok, have, libraries, program, scratch};

#[test]
fn a_c_program_runs_under_oxrun() {
    if !have("cc", REQUIRE_CC) || !have("pkg-config", REQUIRE_CC) {
        return;
    }
    let work = scratch("c-program");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/basic.c");
    let exe = program("cc", &source, "oxccl", "liboxccl.so.0", &work);
    for n in [1, 2, 4] {
        every_rank_ok(
            Command::new(libraries().join("oxrun"))
                .args([
                    "-n",
                    &n.to_string(),
                    "--timeout",
                    "120",
                    "--bind-to",
                    "none",
                ])
                .arg(&exe)
                .env("OXCCL_TIMEOUT", "60"),
            n,
        );
    }
    let _ = std::fs::remove_dir_all(&work);
}
