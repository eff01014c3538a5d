//! Gives libnccl.so the SONAME `libnccl.so.2`, NVIDIA's, so that programs linked against either
//! library run on either, and puts beside it the link `libnccl.so.2` and `nccl.pc`
//! (ffi/build/beside.rs).

#[path = "../ffi/build/beside.rs"]
mod beside;

fn main() {
    beside::place(&beside::Library {
        name: "nccl",
        soname: "libnccl.so.2",
        description: "oxccl's drop-in libnccl: NCCL 2.27's API (include/nccl.h) over oxccl",
        version: "2.27.5",
    });
}
