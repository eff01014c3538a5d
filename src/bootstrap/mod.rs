//! Bootstrap: how ranks find each other before any link exists — a key-value [`Store`] (in
//! process, over authenticated TCP, or a client of PyTorch's `TCPStore`), the [`UniqueId`] that
//! carries a store's address and the job secret, rendezvous from a launcher's environment, and
//! the choice of a local address. Nothing here moves collective data, and nothing outside
//! `bootstrap/` knows how ranks met.
//!
//! Every wait takes a deadline and fails with [`Error::Bootstrap`] naming the key it was waiting
//! for; every TCP connection to oxccl's store proves it belongs to the job with the HMAC
//! challenge-response of [`oxccl_transport::auth`] before anything else is read from it. A
//! PyTorch `TCPStore` ([`TorchStore`], used under torchrun) has no authentication: there the
//! job secret that authenticates the links between ranks is `OXCCL_TOKEN` or published in the
//! store by rank 0 (see [`Rendezvous`]).
//!
//! # The TCP store protocol
//!
//! A connection first runs the auth handshake with context [`STORE_CONTEXT`]. Then each side
//! sends frames — a `u32` little-endian payload length, at most [`MAX_FRAME`], and the payload —
//! and the client sends one request at a time: SET, GET and WAIT (these two with a timeout in
//! milliseconds, for which the server parks them), ADD, CHECK. Each gets one response: OK with
//! a body, TIMEOUT naming the missing key, or ERROR with a message. The byte layout is in
//! `src/bootstrap/wire.rs`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::{Error, Result};

mod client;
mod env;
pub(crate) mod iface;
mod mem;
mod server;
mod torch_store;
pub(crate) mod unique_id;
mod wire;

pub use client::TcpStore;
pub use env::{JobSecret, OpenedStore, Rendezvous, StoreProtocol, token_file, user_key};
pub use mem::MemStore;
pub use oxccl_transport::auth::Secret;
pub use server::{ServerLimits, StoreServer};
pub use torch_store::TorchStore;
pub use unique_id::UniqueId;
pub use wire::{MAX_FRAME, STORE_CONTEXT};

/// A key-value store shared by the ranks of a job: the meeting point of the bootstrap.
///
/// Keys are strings, values are bytes. Values are never deleted, so a key once set stays set
/// (a later `set` replaces the value). Counters made by [`Store::add`] are stored as the
/// decimal ASCII form of an `i64` (`b"-12"`), readable with [`Store::get`].
///
/// Implementations are thread-safe; waits honour their deadline and then fail with
/// [`Error::Bootstrap`] naming the key that was missing.
pub trait Store: Send + Sync {
    /// Sets `key` to `value`, replacing any previous value, and wakes everyone waiting for it.
    fn set(&self, key: &str, value: &[u8]) -> Result<()>;

    /// The value of `key`, waiting until some rank sets it. Fails with [`Error::Bootstrap`]
    /// naming the key when `deadline` passes first (a deadline already passed still returns a
    /// value that is there).
    fn get(&self, key: &str, deadline: Instant) -> Result<Vec<u8>>;

    /// Adds `delta` to the counter at `key` (a missing key counts as 0) atomically and returns
    /// the new value. Fails when the key holds something other than a decimal `i64` or the sum
    /// overflows.
    fn add(&self, key: &str, delta: i64) -> Result<i64>;

    /// Waits until every key in `keys` is set. Fails with [`Error::Bootstrap`] naming a missing
    /// key when `deadline` passes first.
    fn wait(&self, keys: &[&str], deadline: Instant) -> Result<()>;

    /// Whether every key in `keys` is set, without waiting.
    fn check(&self, keys: &[&str]) -> Result<bool>;
}

/// A view of another store with every key prefixed by `prefix/`, so that several groups (the
/// communicators made by a split, say) can share one store without their keys colliding.
#[derive(Clone)]
pub struct PrefixStore {
    inner: Arc<dyn Store>,
    prefix: String,
}

impl PrefixStore {
    /// Keys `k` of this store are `"{prefix}/{k}"` in `inner`.
    pub fn new(inner: Arc<dyn Store>, prefix: String) -> PrefixStore {
        PrefixStore { inner, prefix }
    }

    /// The prefix (without the `/` separator).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn key(&self, key: &str) -> String {
        format!("{}/{key}", self.prefix)
    }
}

impl std::fmt::Debug for PrefixStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefixStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl Store for PrefixStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.set(&self.key(key), value)
    }

    fn get(&self, key: &str, deadline: Instant) -> Result<Vec<u8>> {
        self.inner.get(&self.key(key), deadline)
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.inner.add(&self.key(key), delta)
    }

    fn wait(&self, keys: &[&str], deadline: Instant) -> Result<()> {
        let full: Vec<String> = keys.iter().map(|k| self.key(k)).collect();
        let refs: Vec<&str> = full.iter().map(String::as_str).collect();
        self.inner.wait(&refs, deadline)
    }

    fn check(&self, keys: &[&str]) -> Result<bool> {
        let full: Vec<String> = keys.iter().map(|k| self.key(k)).collect();
        let refs: Vec<&str> = full.iter().map(String::as_str).collect();
        self.inner.check(&refs)
    }
}

/// The one definition of [`Store::add`] on a map, shared by [`MemStore`] and the TCP server.
/// Returns the new value, or why the add is impossible.
fn add_counter(
    map: &mut HashMap<String, Vec<u8>>,
    key: &str,
    delta: i64,
) -> std::result::Result<i64, String> {
    let old = match map.get(key) {
        None => 0,
        Some(bytes) => std::str::from_utf8(bytes)
            .ok()
            .and_then(|s| s.parse::<i64>().ok())
            .ok_or_else(|| format!("add to key {key:?}: its value is not a decimal i64 counter"))?,
    };
    let new = old
        .checked_add(delta)
        .ok_or_else(|| format!("add {delta} to key {key:?} (now {old}) overflows i64"))?;
    map.insert(key.to_owned(), new.to_string().into_bytes());
    Ok(new)
}

/// The first key of `keys` that `map` lacks.
fn first_missing<'k, K: AsRef<str>>(
    map: &HashMap<String, Vec<u8>>,
    keys: &'k [K],
) -> Option<&'k str> {
    keys.iter()
        .map(AsRef::as_ref)
        .find(|k| !map.contains_key(*k))
}

/// The key a wait that ran out named ([`not_set`]'s error), or `None` for any other error
/// (the store did not answer, refused, or is gone): which rank never published what the
/// waiter needed, as opposed to a store that failed.
pub(crate) fn missing_key(e: &Error) -> Option<String> {
    let Error::Bootstrap(m) = e else {
        return None;
    };
    let (_, rest) = m.split_once(": key \"")?;
    let (key, tail) = rest.split_once("\" was not set before the deadline")?;
    tail.starts_with(" (").then(|| key.to_owned())
}

/// The error of a wait that ran out, naming the store and the key.
fn not_set(store: &str, key: &str, waited: std::time::Duration) -> Error {
    // A wait asked for after the deadline passed (an earlier wait of the same setup took the
    // time) waits for nothing: "waited 50ns" would mislead.
    let waited = if waited < std::time::Duration::from_millis(1) {
        "the deadline had passed when this wait began".to_owned()
    } else {
        format!("waited {waited:.1?}")
    };
    Error::Bootstrap(format!(
        "{store}: key {key:?} was not set before the deadline ({waited})"
    ))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{MemStore, PrefixStore, Store, missing_key};
    use crate::Error;

    /// A wait that ran out names its key (prefix and all, whatever the store); any other
    /// error names none.
    #[test]
    fn a_wait_that_ran_out_names_its_key() {
        let store = PrefixStore::new(std::sync::Arc::new(MemStore::new()), "world/3".into());
        store.set("ready/0", b"x").unwrap();
        let soon = Instant::now() + Duration::from_millis(20);
        let e = store.wait(&["ready/0", "ready/1"], soon).unwrap_err();
        assert_eq!(missing_key(&e).as_deref(), Some("world/3/ready/1"), "{e}");
        let e = store.get("peer/7", Instant::now()).unwrap_err();
        assert_eq!(missing_key(&e).as_deref(), Some("world/3/peer/7"), "{e}");
        for other in [
            Error::Bootstrap("store at 127.0.0.1:1: no answer to add to \"k\" in time".into()),
            Error::Bootstrap("a key \"k\" was not set before the deadline".into()),
            Error::InvalidArgument("key \"k\" was not set before the deadline (x)".into()),
        ] {
            assert_eq!(missing_key(&other), None, "{other}");
        }
    }
}
