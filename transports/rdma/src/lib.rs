//! oxccl-transport-rdma: links between ranks over RDMA verbs (InfiniBand and RoCE), for ranks
//! on different hosts of a cluster.
//!
//! [`RdmaTransport`] picks one device port per rank from sysfs (`OXCCL_IB_HCA`, with
//! NCCL_IB_HCA's syntax, and `OXCCL_IB_GID_INDEX`; see [`device`]), opens it through
//! `libibverbs.so.1` loaded at run time — a machine without rdma-core builds and runs, and the
//! transport says it is unavailable — and connects one reliable-connected queue pair per peer.
//! [`RdmaLink`] moves messages with RDMA WRITE WITH IMM into the peer's registered receive
//! ring; see its module for the protocol.
//!
//! This crate only moves bytes: it never reduces, never blocks in [`oxccl_transport::Link`]
//! calls, and checks every length and count the peer sends before trusting it.

pub mod device;
mod link;
#[doc(hidden)]
pub mod sys;
mod transport;
mod verbs;

pub use link::RdmaLink;
pub use transport::{RdmaConfig, RdmaTransport};
pub use verbs::Remote;

/// Whether libibverbs can be loaded here; the error says why not.
pub fn verbs_available() -> Result<(), String> {
    sys::verbs().map(|_| ())
}
