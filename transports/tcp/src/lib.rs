//! oxccl-transport-tcp: links between ranks over TCP sockets, for ranks on different hosts (or
//! the same host when nothing faster is available).
//!
//! [`TcpTransport`] listens on one port per rank, publishes the address as its endpoint, and in
//! [`Transport::connect`](oxccl_transport::Transport::connect) sets up exactly two authenticated
//! connections per peer, one for each direction of data ([`wire::Lane`]): the higher rank
//! connects, the lower accepts, and both prove knowledge of the job's
//! [`Secret`](oxccl_transport::auth::Secret) before anything else is exchanged.
//! [`TcpLink`] then moves framed messages (see [`wire`]) with zero-copy sends and receives into
//! a double-mapped ring, so lent messages are always contiguous.
//!
//! This crate only moves bytes: it never reduces, never blocks in [`oxccl_transport::Link`]
//! calls, and never trusts a length it read from the network before checking it.

#[doc(hidden)]
pub mod fuzzing;
mod handshake;
mod inbox;
mod link;
mod outbox;
mod ring;
mod transport;
pub mod wire;

pub use link::{LinkStats, TcpLink};
pub use transport::{TcpConfig, TcpTransport};
pub use wire::{decode_endpoint, encode_endpoint};
