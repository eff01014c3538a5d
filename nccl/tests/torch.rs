//! PyTorch's CUDA library (libtorch_cuda.so, built against NCCL 2.30) loads with our
//! libnccl.so.2 in NVIDIA's place: `LD_PRELOAD` puts ours first, `import torch` must succeed
//! (every NCCL symbol libtorch_cuda needs is defined, the newer ones as "not implemented"), and
//! the dynamic linker must bind libtorch_cuda's NCCL calls to ours. A CPU machine loads
//! libtorch_cuda too (torch's CUDA wheel), so this runs in CI; whether torch's NCCL backend
//! then works needs a GPU (not shown here). torch comes from `OXCCL_PYTHON`, else the CI's
//! virtualenv; without it the test says "skipped" (a failure with `OXCCL_REQUIRE_TORCH=1`).

#[path = "../../ffi/tests/util/mod.rs"]
mod util;

use std::path::PathBuf;
use std::process::Command;

/// The Python with torch, or `None` after saying why it is skipped.
fn python() -> Option<PathBuf> {
    let path = std::env::var_os("OXCCL_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_default();
            PathBuf::from(home).join(".cache/oxccl/torch-venv/bin/python")
        });
    let found = Command::new(&path)
        .args(["-c", "import torch"])
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        return Some(path);
    }
    assert!(
        std::env::var("OXCCL_REQUIRE_TORCH").as_deref() != Ok("1"),
        "OXCCL_REQUIRE_TORCH=1 but {} cannot import torch",
        path.display()
    );
    println!("skipped: no torch at {}", path.display());
    None
}

#[test]
fn torch_loads_with_our_libnccl_in_nvidia_s_place() {
    let Some(python) = python() else {
        return;
    };
    let ours = util::libraries().join("libnccl.so.2");
    let script = "import os, torch\n\
                  lib = os.path.join(os.path.dirname(torch.__file__), 'lib', 'libtorch_cuda.so')\n\
                  print('cuda build' if os.path.exists(lib) else 'cpu build')\n";
    let out = Command::new(&python)
        .args(["-c", script])
        .env("LD_PRELOAD", &ours)
        .env("LD_DEBUG", "bindings")
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "import torch failed with {} preloaded: {}",
        ours.display(),
        stderr
            .lines()
            .filter(|l| !l.contains("binding file"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    if stdout.contains("cpu build") {
        println!("skipped: this torch has no libtorch_cuda.so");
        return;
    }
    // The dynamic linker's log: libtorch_cuda's ncclAllReduce, and one of the functions after
    // NCCL 2.27 that it needs, bound to our library.
    for symbol in ["ncclAllReduce", "ncclCommGetUniqueId"] {
        let bound = stderr.lines().any(|l| {
            l.contains("libtorch_cuda.so")
                && l.contains(&format!("to {}", ours.display()))
                && l.contains(&format!("`{symbol}'"))
        });
        assert!(
            bound,
            "libtorch_cuda's {symbol} is not bound to {}",
            ours.display()
        );
    }
}
