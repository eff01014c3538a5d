//! The structure layouts and constants `sys.rs` spells out by hand agree with rdma-core's own
//! `<infiniband/verbs.h>`: a C program compiled against the installed header prints each fact
//! and the test compares. Where no header or C compiler is installed it says
//! "skipped: …" (`OXCCL_REQUIRE_VERBS=1`, set by CI, makes that a failure).

use std::process::Command;

#[test]
fn hand_written_layouts_match_the_installed_verbs_header() {
    let require = std::env::var_os("OXCCL_REQUIRE_VERBS").is_some();
    let header = [
        "/usr/include/infiniband/verbs.h",
        "/usr/local/include/infiniband/verbs.h",
    ]
    .iter()
    .any(|p| std::path::Path::new(p).exists());
    let cc = Command::new("cc").arg("--version").output().is_ok();
    if !header || !cc {
        let why = if header {
            "no cc"
        } else {
            "no <infiniband/verbs.h> (libibverbs-dev)"
        };
        assert!(!require, "OXCCL_REQUIRE_VERBS is set but there is {why}");
        println!("skipped: {why}");
        return;
    }
    let facts = oxccl_transport_rdma::sys::layout_facts();
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\nint main(void) {\n",
    );
    for (expr, _) in &facts {
        c.push_str(&format!("  printf(\"%ld\\n\", (long)({expr}));\n"));
    }
    c.push_str("  return 0;\n}\n");
    let dir = std::env::temp_dir().join(format!("oxccl-verbs-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, c).unwrap();
    let out = Command::new("cc")
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&exe).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let got: Vec<i64> = text.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(got.len(), facts.len());
    let wrong: Vec<String> = facts
        .iter()
        .zip(&got)
        .filter(|((_, ours), theirs)| ours != *theirs)
        .map(|((expr, ours), theirs)| format!("{expr}: ours {ours}, header {theirs}"))
        .collect();
    assert!(
        wrong.is_empty(),
        "layouts differ from verbs.h:\n{}",
        wrong.join("\n")
    );
    println!("{} layout facts agree with verbs.h", facts.len());
    std::fs::remove_dir_all(&dir).unwrap();
}
