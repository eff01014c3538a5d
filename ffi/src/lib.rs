//! oxccl's C ABI: nccl.h's functions, shapes and numeric values with an `oxccl` prefix
//! (`oxcclCommInitRank`, `oxcclAllReduce`, ...), built as `liboxccl.so` / `liboxccl.a`, with
//! `include/oxccl.h` generated from this crate by cbindgen. It holds no collective logic: every
//! function validates its arguments, calls the Rust API of the `oxccl` crate and turns the
//! outcome into an `oxcclResult_t`.
//!
//! The boundary is safe for any argument a C caller can pass short of a dangling buffer pointer:
//! enum values are plain ints that are checked, communicator handles are looked up in a
//! registry before use (a NULL, destroyed or foreign handle is an error, never a dereference),
//! sizes are checked for overflow, and a panic becomes `oxcclInternalError`. The message of the
//! last failure on the calling thread is returned by `oxcclGetLastError`.
//!
//! Memory: with a NULL `stream`, host memory, and a call completes before it returns; with a CUDA
//! stream, a collective's buffers are device memory, staged through host memory in stream
//! order ([`device`]).

#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]

// oxccl.h follows this order (rustfmt keeps it: one module per group): types, then creation
// and queries, then the collectives.
mod abi;

mod lifecycle;

mod collectives;

mod device;

mod dispatch;

mod requests;

mod ops;

mod memory;

mod boundary;
mod entry;
mod handles;

pub use abi::*;
pub use collectives::*;
pub use dispatch::*;
pub use lifecycle::*;
pub use memory::*;
pub use ops::*;
pub use requests::*;

#[cfg(test)]
mod tests;
