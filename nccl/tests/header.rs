//! include/nccl.h: compiles as C99 and C++17 with every warning an error, alone and with CUDA's
//! runtime headers before or after it (tests/c/fake-cuda stands in for them; then it brings in
//! CUDA's half and bfloat16 types as NVIDIA's nccl.h does), and agrees with
//! oxccl.h on every value, size and offset the two share (tests/c/values.c).

#[path = "../../ffi/tests/util/mod.rs"]
mod util;

use std::path::{Path, PathBuf};
use std::process::Command;

fn c_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c")
}

/// A program that uses the header's types and macros, with CUDA's headers included as `order`
/// says: "" (not at all), "before", "after", or "later" (after, by a path the compiler cannot
/// find beforehand, so nccl.h cannot include it first).
fn source(order: &str) -> String {
    let (before, after) = match order {
        "before" => ("#include <cuda_runtime.h>\n", ""),
        "after" => ("", "#include <cuda_runtime.h>\n"),
        "later" => ("", "#include \"fake-cuda/cuda_runtime.h\"\n"),
        _ => ("", ""),
    };
    // Where nccl.h sees CUDA's runtime headers, it brings in CUDA's 16-bit float types as
    // NVIDIA's does (nccl-tests uses them without including their headers).
    let halves = if matches!(order, "before" | "after") {
        "__half h; __nv_bfloat16 b; (void)h; (void)b;\n"
    } else {
        ""
    };
    format!(
        "{before}#include \"nccl.h\"\n{after}\
         int main(void) {{\n\
           ncclConfig_t config = NCCL_CONFIG_INITIALIZER;\n\
           ncclUniqueId id;\n\
           ncclComm_t comm = NCCL_COMM_NULL;\n\
           cudaStream_t stream = NULL;\n\
           int version = 0;\n\
           (void)config; (void)id; (void)comm; (void)stream;\n\
           {halves}\
           return ncclGetVersion(&version) == ncclSuccess ? (int)ncclSum : (int)ncclNumOps;\n\
         }}\n"
    )
}

/// Compiles [`source`] for every `order` with `compiler` as `std`.
fn compiles(compiler: &str, std: &str, ext: &str, orders: &[&str]) {
    if !util::have(compiler, util::REQUIRE_CC) {
        return;
    }
    let include = util::repo().join("include");
    let (c_dir, fake) = (c_dir(), c_dir().join("fake-cuda"));
    let work = util::scratch(&format!("nccl-header-{std}"));
    for order in orders {
        let src = work.join(format!(
            "use-{}.{ext}",
            if order.is_empty() { "alone" } else { order }
        ));
        std::fs::write(&src, source(order)).expect("write source");
        // The fake CUDA is on the include path only where the program includes it by name: then
        // nccl.h finds it too, as it would find CUDA's.
        let dirs: &[&Path] = match *order {
            "before" | "after" => &[&include, &fake],
            _ => &[&include, &c_dir],
        };
        util::syntax_check(compiler, std, &src, dirs);
    }
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn nccl_h_compiles_as_c99_alone_and_beside_cuda() {
    compiles("cc", "c99", "c", &["", "before", "after"]);
}

#[test]
fn nccl_h_compiles_as_cpp17_alone_and_beside_cuda() {
    compiles("c++", "c++17", "cpp", &["", "before", "after", "later"]);
}

/// Where nccl.h cannot see CUDA's headers in advance, it declares cudaStream_t and CUDA's header
/// declares it again: legal from C11 on only if the two declarations are the same type.
#[test]
fn nccl_h_declares_cuda_s_stream_type() {
    compiles("cc", "c11", "c", &["later"]);
}

#[test]
fn nccl_h_values_match_oxccl_h() {
    if !util::have("cc", util::REQUIRE_CC) {
        return;
    }
    let work = util::scratch("nccl-values");
    let exe = work.join("values");
    util::succeed(
        Command::new("cc")
            .arg("-std=c11")
            .args(util::STRICT)
            .arg("-I")
            .arg(util::repo().join("include"))
            .arg(c_dir().join("values.c"))
            .arg("-o")
            .arg(&exe),
        "compiling tests/c/values.c",
    );
    util::succeed(&mut Command::new(&exe), "tests/c/values.c");
    let _ = std::fs::remove_dir_all(&work);
}
