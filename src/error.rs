//! The one error type of the crate. Variants are structured so callers can match on what went
//! wrong; messages name the rank, the peer and the operation wherever one is involved.

use std::time::Duration;

use crate::types::Rank;

/// Everything that can go wrong in oxccl.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument was wrong: a length, a root, a data type, an operator for that type.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// A feature this build or this machine lacks (no CUDA driver, no RDMA device, ...).
    #[error("unavailable: {0}")]
    Unavailable(String),

    /// A wait ran past its deadline.
    #[error("rank {rank}: {op} timed out after {after:?} waiting for rank {peer}")]
    Timeout {
        /// The rank that gave up waiting.
        rank: Rank,
        /// The operation, with its sequence number (`"all_reduce #12"`).
        op: String,
        /// The peer it was waiting for.
        peer: Rank,
        /// How long it waited.
        after: Duration,
    },
}

/// `Result` with oxccl's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
