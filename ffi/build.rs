//! Gives liboxccl.so its SONAME, so that programs linked against it record `liboxccl.so.0`, and
//! puts beside it the link `liboxccl.so.0` and `oxccl.pc` (build/beside.rs).

#[path = "build/beside.rs"]
mod beside;

fn main() {
    beside::place(&beside::Library {
        name: "oxccl",
        soname: "liboxccl.so.0",
        description: "oxccl's C ABI: collective communication (nccl.h's API with an oxccl prefix)",
        version: env!("CARGO_PKG_VERSION"),
    });
}
