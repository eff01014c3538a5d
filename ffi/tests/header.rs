//! `include/oxccl.h` is generated from this crate by cbindgen: fails when the committed header is
//! stale (`OXCCL_UPDATE_HEADER=1` rewrites it), and checks that it compiles as C99 and C++17
//! with every warning an error.

mod util;

use std::path::PathBuf;

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn header_path() -> PathBuf {
    crate_dir().join("../include/oxccl.h")
}

fn generate() -> String {
    let dir = crate_dir();
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("ffi/cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(&dir)
        .with_config(config)
        .generate()
        .expect("cbindgen");
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).expect("utf-8 header")
}

#[test]
fn the_header_is_current() {
    let fresh = generate();
    let path = header_path();
    if std::env::var_os("OXCCL_UPDATE_HEADER").is_some_and(|v| v == "1") {
        std::fs::write(&path, &fresh).expect("write include/oxccl.h");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "include/oxccl.h is stale: the C ABI in ffi/src changed. Regenerate it with\n\
         \tOXCCL_UPDATE_HEADER=1 cargo test -p oxccl-ffi --test header\n\
         and commit the result."
    );
}

/// Compiles a file that includes the header with `compiler` in `std`, or says it skipped. It
/// compiles the header as generated now (`the_header_is_current` checks that it is the committed
/// one), so that it never reads a file that test is rewriting.
fn compiles(compiler: &str, std: &str, ext: &str) {
    if !util::have(compiler, util::REQUIRE_CC) {
        return;
    }
    let dir = util::scratch(&format!("header-{std}"));
    std::fs::write(dir.join("oxccl.h"), generate()).expect("write the header");
    let src = dir.join(format!("use.{ext}"));
    std::fs::write(
        &src,
        "#include \"oxccl.h\"\n\
         int main(void) {\n\
           oxcclUniqueId id; oxcclComm_t comm = NULL; int v = 0;\n\
           (void)id; (void)comm;\n\
           return oxcclGetVersion(&v) == oxcclSuccess ? 0 : (int)sizeof(oxcclUniqueId);\n\
         }\n",
    )
    .expect("write source");
    util::syntax_check(compiler, std, &src, &[&dir]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_header_compiles_as_c99() {
    compiles("cc", "c99", "c");
}

#[test]
fn the_header_compiles_as_cpp17() {
    compiles("c++", "c++17", "cpp");
}
