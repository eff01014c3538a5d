//! The in-process store, for jobs whose ranks are threads of one process. It must not do I/O;
//! waits sleep on a condition variable and honour their deadline.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use super::{Store, add_counter, first_missing, not_set};
use crate::{Error, Result};

/// A [`Store`] in this process's memory: a map behind a mutex, and a condition variable that
/// wakes waiters whenever a key is set.
#[derive(Debug, Default)]
pub struct MemStore {
    map: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
}

impl MemStore {
    /// An empty store.
    pub fn new() -> MemStore {
        MemStore::default()
    }

    // Every update is a single insert, so a panic elsewhere cannot leave the map half-changed;
    // a poisoned lock is therefore safe to keep using.
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Vec<u8>>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until `keys` are all set; returns the guard so the caller can read them.
    fn wait_for<'a>(
        &'a self,
        keys: &[&str],
        deadline: Instant,
    ) -> Result<MutexGuard<'a, HashMap<String, Vec<u8>>>> {
        let start = Instant::now();
        let mut map = self.lock();
        loop {
            let Some(missing) = first_missing(&map, keys) else {
                return Ok(map);
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(not_set("in-process store", missing, now - start));
            }
            map = self
                .changed
                .wait_timeout(map, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

impl Store for MemStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.lock().insert(key.to_owned(), value.to_vec());
        self.changed.notify_all();
        Ok(())
    }

    fn get(&self, key: &str, deadline: Instant) -> Result<Vec<u8>> {
        let map = self.wait_for(&[key], deadline)?;
        map.get(key)
            .cloned()
            .ok_or_else(|| Error::Bootstrap(format!("in-process store: key {key:?} vanished")))
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let new = add_counter(&mut self.lock(), key, delta)
            .map_err(|why| Error::Bootstrap(format!("in-process store: {why}")))?;
        self.changed.notify_all();
        Ok(new)
    }

    fn wait(&self, keys: &[&str], deadline: Instant) -> Result<()> {
        self.wait_for(keys, deadline).map(drop)
    }

    fn check(&self, keys: &[&str]) -> Result<bool> {
        Ok(first_missing(&self.lock(), keys).is_none())
    }
}
