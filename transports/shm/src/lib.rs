//! oxccl-transport-shm: links between ranks of one host through shared memory.
//!
//! Each direction of a link is a single-producer single-consumer ring of slots in an anonymous
//! `memfd` segment that the receiver creates and hands to the sender over an authenticated Unix
//! socket; nothing is ever named in `/dev/shm`, so no crash leaves anything behind. Small
//! messages are copied into a slot and may be reduced straight out of it; large ones, when the
//! receiver already waits for them, are read directly from the sender's memory
//! (`process_vm_readv`), one copy instead of two. Waiting spins, then yields, then sleeps on an
//! eventfd that the peer rings only if this side announced its sleep.
//!
//! Modules: [`ring`] (the lock-free protocol), [`doorbell`] (sleep and wake), [`segment`]
//! (memfd mappings), [`area`] (the group area), [`cma`] (direct reads of a peer's memory),
//! [`link`] and [`transport`] (the `Link`/`Transport` implementations); `primitive` is the
//! loom shim.

pub mod area;
pub mod cma;
pub mod doorbell;
pub mod link;
mod primitive;
pub mod ring;
pub mod segment;
mod setup;
pub mod transport;

pub use link::ShmLink;
#[doc(hidden)]
pub use setup::{decode_hand_over, decode_hello};
pub use transport::{AreaSet, ShmConfig, ShmTransport};
