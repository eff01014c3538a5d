//! The pure core stays pure: `src/algo/` uses nothing from the crate but `types`, and nothing
//! from std that does I/O, threads or clocks.

use std::fs;
use std::path::Path;

const FORBIDDEN_STD: &[&str] = &[
    "std::net",
    "std::thread",
    "std::time",
    "std::sync",
    "std::io",
    "std::fs",
    "std::process",
    "std::env",
];

#[test]
fn algo_imports_only_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/algo");
    let mut files = 0;
    for entry in fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        files += 1;
        let text = fs::read_to_string(&path).unwrap();
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for (pos, _) in code.match_indices("crate::") {
                let rest = &code[pos + "crate::".len()..];
                assert!(
                    rest.starts_with("types"),
                    "{}:{}: algo/ may only use crate::types: {line}",
                    path.display(),
                    i + 1
                );
            }
            for bad in FORBIDDEN_STD {
                assert!(
                    !code.contains(bad),
                    "{}:{}: algo/ must not use {bad}",
                    path.display(),
                    i + 1
                );
            }
            for bad in ["oxccl_transport", "Instant", "SystemTime"] {
                assert!(
                    !code.contains(bad),
                    "{}:{}: algo/ must not use {bad}",
                    path.display(),
                    i + 1
                );
            }
        }
    }
    assert!(files >= 8, "expected the algo sources, found {files} files");
}
