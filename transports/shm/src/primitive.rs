//! The atomics the lock-free code uses, from one place: `std`'s normally, loom's when built with
//! `RUSTFLAGS="--cfg loom"`, so the same ring and doorbell code is model-checked (crossbeam's
//! pattern). Lock-free code in this crate imports atomics only from here.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};
