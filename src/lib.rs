//! oxccl: collective communication for CPUs and GPUs.
//!
//! Processes ("ranks") that each hold a buffer call the same collective — all-reduce,
//! all-gather, reduce-scatter, broadcast, ... — and oxccl moves and reduces the bytes between
//! them over shared memory, TCP or RDMA verbs.
//!
//! ```no_run
//! use oxccl::{Communicator, Config, ReduceOp};
//!
//! fn main() -> Result<(), oxccl::Error> {
//!     // One process per rank, started by a launcher (oxrun, torchrun, srun, mpirun).
//!     let comm = Communicator::init(Config::from_env()?)?;
//!     let mut grads = vec![comm.rank() as f32; 1 << 20];
//!     comm.all_reduce_in_place(&mut grads, ReduceOp::Sum)?;
//!     Ok(())
//! }
//! ```
//!
//! The same with the ranks as threads of one process:
//!
//! ```
//! use oxccl::{Communicator, Config, ReduceOp};
//!
//! let comms = Communicator::init_local(2, Config::default()).unwrap();
//! std::thread::scope(|s| {
//!     for comm in &comms {
//!         s.spawn(move || {
//!             let mut x = vec![comm.rank() as f32 + 1.0; 4];
//!             comm.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
//!             assert_eq!(x, [3.0; 4]);
//!         });
//!     }
//! });
//! ```
//!
//! How each call runs is one decision ([`Communicator::explain`] returns it as a
//! [`Decision`]); a call that returns, whatever its result, leaves no peer touching its
//! buffers; every wait has a deadline ([`Config::timeout`]).
//!
//! Beside the communicator, the crate's layers are usable on their own:
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
mod comm;
pub mod config;
pub mod error;
mod exec;
mod files;
pub mod float8;
#[cfg(test)]
mod fuzz;
pub mod launch;
mod logging;
pub mod reduce;
pub mod topo;
pub mod trace;
pub mod tune;
pub mod types;
mod work;

/// This library's version (the crate version).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The most ranks a communicator may have (2^20). Creation reserves per-rank state before it
/// hears from any peer, so a size beyond this (a C caller's `INT_MAX`, a garbled
/// `WORLD_SIZE`) is refused with `InvalidArgument` instead of an allocation of gigabytes.
pub const MAX_RANKS: usize = 1 << 20;

/// The most ranks [`Communicator::init_local`] runs in one process (a thread each). Every pair
/// of them gets its links, so memory grows with the square of the count: 256 ranks took 211 MB
/// at their peak, 1024 took 2.1 GB and 4096 passed 8 GB before their deadline (2026-12-05).
pub const MAX_LOCAL_RANKS: usize = 256;

pub use bootstrap::UniqueId;
#[cfg(feature = "cuda")]
pub use comm::NativeCall;
pub use comm::{Calibration, Communicator, Group, PROBE_ROUNDS, Pending, RawMessage, Registration};
pub use config::{Config, Tune};
pub use error::{Error, Result};
pub use float8::{F8E4M3, F8E5M2};
pub use tune::{Decision, DeviceWay, Route, Way};
pub use types::{DataType, Element, Rank, ReduceOp};
pub use work::{OwnedBuffer, Work};
