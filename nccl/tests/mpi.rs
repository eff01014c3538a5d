//! An NCCL program written as NCCL's documentation shows (tests/c/nccl_mpi.c), compiled with
//! mpicc against include/nccl.h, linked with -lnccl against our libnccl.so (the flags of
//! nccl.pc) and started by Open MPI's mpirun on 2 and 4 ranks. It finds the library only under
//! the name `libnccl.so.2`, its SONAME.

#[path = "../../ffi/tests/util/mod.rs"]
mod util;

use std::path::Path;
use std::process::Command;

use util::{REQUIRE_CC, REQUIRE_MPI, every_rank_ok, have, program, scratch};

#[test]
fn an_nccl_program_runs_under_mpirun() {
    let tools = [
        ("pkg-config", REQUIRE_CC),
        ("mpicc", REQUIRE_MPI),
        ("mpirun", REQUIRE_MPI),
    ];
    if !tools.iter().all(|(tool, require)| have(tool, require)) {
        return;
    }
    let work = scratch("nccl-mpi");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/nccl_mpi.c");
    let exe = program("mpicc", &source, "nccl", "libnccl.so.2", &work);
    for n in [2, 4] {
        every_rank_ok(
            Command::new("mpirun")
                .args(["-np", &n.to_string()])
                .arg(&exe)
                // Open MPI's switches as variables, which other MPIs ignore: root may start
                // ranks (CI runs as root), more ranks than cores, none pinned.
                .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
                .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
                .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
                .env("OMPI_MCA_hwloc_base_binding_policy", "none")
                .env("OXCCL_TIMEOUT", "60"),
            n,
        );
    }
    let _ = std::fs::remove_dir_all(&work);
}
