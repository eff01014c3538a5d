//! The one error type of the crate. Variants are structured so callers can match on what went
//! wrong; messages name the rank, the peer and the operation (with its sequence number, as in
//! `all_reduce #12`) wherever one is involved.

use std::time::Duration;

use oxccl_transport::TransportError;

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
    #[error("rank {rank}: {op} timed out after {after:.1?}{}", waiting_for(*peer))]
    Timeout {
        /// The rank that gave up waiting.
        rank: Rank,
        /// The operation and its sequence number (`"all_reduce #12"`).
        op: String,
        /// The peer it was waiting for, when one is known.
        peer: Option<Rank>,
        /// How long it waited.
        after: Duration,
    },

    /// A peer died, closed its connection, or failed an operation both were in.
    #[error("rank {rank}: {op} failed because rank {peer} failed: {cause}")]
    PeerFailed {
        /// The rank reporting.
        rank: Rank,
        /// The failed peer.
        peer: Rank,
        /// The operation and its sequence number.
        op: String,
        /// What is known of the failure.
        cause: String,
    },

    /// Two ranks called different collectives (or counts, types, roots, algorithms) at the same
    /// point of their sequences.
    #[error(
        "rank {rank}: {op} does not match rank {peer}'s call: rank {rank} called {ours}, rank {peer} called {theirs}"
    )]
    Mismatch {
        /// The rank reporting.
        rank: Rank,
        /// The peer whose call differs.
        peer: Rank,
        /// The operation and its sequence number.
        op: String,
        /// This rank's call.
        ours: String,
        /// The peer's call.
        theirs: String,
    },

    /// The communicator was aborted (by [`crate::Communicator::abort`] or an earlier failure).
    #[error("rank {rank}: {op} aborted: {why}")]
    Aborted {
        /// The rank reporting.
        rank: Rank,
        /// The operation and its sequence number.
        op: String,
        /// Why (`"abort() was called"`, or the earlier error).
        why: String,
    },

    /// Finding the other ranks failed: the store, the launcher's environment, authentication.
    #[error("bootstrap: {0}")]
    Bootstrap(String),

    /// A transport failed outside a collective (while connecting, say).
    #[error("rank {rank}: {what}: {source}")]
    Transport {
        /// The rank reporting.
        rank: Rank,
        /// What was being done.
        what: String,
        /// The transport's error.
        #[source]
        source: TransportError,
    },

    /// The operating system refused something outside any transport.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

fn waiting_for(peer: Option<Rank>) -> String {
    match peer {
        Some(p) => format!(" waiting for rank {p}"),
        None => String::new(),
    }
}

/// `Result` with oxccl's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
