//! oxccl: collective communication for CPUs and GPUs.
//!
//! Processes ("ranks") that each hold a buffer call the same collective — all-reduce,
//! all-gather, reduce-scatter, broadcast, ... — and oxccl moves and reduces the bytes between
//! them over shared memory, TCP or RDMA verbs.
//!
//! The crate is built in layers, each usable on its own:
//!
//! - [`types`]: data types, reduction operators and their exact arithmetic contract;
//! - [`reduce`]: the element-wise reduction kernels;
//! - [`algo`]: pure collective algorithms that turn a call into a [`algo::Schedule`] of sends,
//!   receives and reductions, plus [`algo::sim`], an in-memory simulator that runs and prices
//!   schedules for any number of ranks.
//!
//! ```
//! use oxccl::algo::{self, Algorithm, Choice, Collective, Plan};
//! use oxccl::types::{DataType, ReduceOp};
//!
//! // What rank 1 of 4 does in a ring all-reduce of 1000 floats.
//! let plan = Plan::new(Collective::AllReduce, 1000, DataType::F32).op(ReduceOp::Sum);
//! let schedule = algo::schedule(&plan, &Choice::new(Algorithm::Ring), 1, 4).unwrap();
//! assert_eq!(schedule.bytes_sent(), 2 * 3 * 1000 * 4 / 4); // 2(n-1)/n of the buffer
//! ```

pub mod algo;
pub mod bootstrap;
pub mod comm;
pub mod config;
pub mod error;
pub mod exec;
pub mod launch;
mod logging;
pub mod reduce;
pub mod topo;
pub mod tune;
pub mod types;
pub mod work;

/// This library's version (the crate version).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

pub use comm::{Communicator, Group};
pub use config::Config;
pub use error::{Error, Result};
pub use types::{DataType, Element, Rank, ReduceOp};
pub use work::{OwnedBuffer, Work};
