//! Configuration: a builder with defaults, filled from `OXCCL_*` environment variables by
//! [`Config::from_env`]. Plain data; nothing here opens sockets or reads files beyond the
//! environment.

use std::time::Duration;

use crate::algo::{Algorithm, Choice};
use crate::error::{Error, Result};

/// How a communicator behaves. Every field has a default; [`Config::from_env`] overrides them
/// from the environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Deadline of every wait: a collective, a connection, a store lookup (`OXCCL_TIMEOUT`,
    /// seconds; default 300).
    pub timeout: Duration,
    /// Forces an algorithm where it applies (`OXCCL_ALGO`: ring, tree, hd, direct).
    pub algorithm: Option<Algorithm>,
    /// Which transports may be used, in preference order (`OXCCL_TRANSPORTS`).
    pub transports: TransportFilter,
    /// Interfaces for TCP (`OXCCL_SOCKET_IFNAME`, NCCL_SOCKET_IFNAME syntax).
    pub socket_ifname: Option<String>,
    /// This process's host identity, overriding discovery (`OXCCL_HOST_ID`).
    pub host_id: Option<String>,
    /// Largest message, in bytes: collectives are cut into slices of this size
    /// (`OXCCL_SLICE_BYTES`; default 256 KiB).
    pub slice_bytes: usize,
    /// Scratch slots per pipeline (`OXCCL_SCRATCH_SLOTS`; default 4): scratch memory per
    /// communicator is at most a few times `slice_bytes × scratch_slots`.
    pub scratch_slots: usize,
    /// All-reduces between ranks of one host of at least this many bytes, up to
    /// [`Config::direct_max`] (any size in place), read and write each other's memory directly
    /// by system calls when every rank can (`OXCCL_DIRECT_MIN`, bytes, or `off`; default
    /// [`Config::DEFAULT_DIRECT_MIN`]); the others go through the shared group area. Ranks that
    /// are configured differently agree at each call: direct only if every rank would.
    pub direct_min: usize,
    /// The largest out-of-place all-reduce, in bytes, that reaches peers' memory directly
    /// (`OXCCL_DIRECT_MAX`; default [`Config::DEFAULT_DIRECT_MAX`]).
    pub direct_max: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            timeout: Duration::from_secs(300),
            algorithm: None,
            transports: TransportFilter::default(),
            socket_ifname: None,
            host_id: None,
            slice_bytes: Choice::DEFAULT_SLICE_BYTES,
            scratch_slots: Choice::DEFAULT_SCRATCH_SLOTS,
            direct_min: Config::DEFAULT_DIRECT_MIN,
            direct_max: Config::DEFAULT_DIRECT_MAX,
        }
    }
}

impl Config {
    /// Default [`Config::direct_min`]: on the reference machine reaching peers' memory directly
    /// beats copies through the group area for every size past the one-shot's 16 KiB (see the
    /// README's performance section).
    pub const DEFAULT_DIRECT_MIN: usize = 16 << 10;
    /// Default [`Config::direct_max`]: beyond it, out of place, the data is no longer in cache
    /// and the kernel's page-by-page copies lose to streaming through the group area; in place
    /// they still win (they write lines just read).
    pub const DEFAULT_DIRECT_MAX: usize = 4 << 20;

    /// Defaults overridden by the `OXCCL_*` variables present in the environment.
    pub fn from_env() -> Result<Config> {
        Config::from_vars(|k| std::env::var(k).ok())
    }

    /// Defaults overridden by the variables `get` returns (for tests).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let mut c = Config::default();
        let bad =
            |var: &str, v: &str, why: &str| Error::InvalidArgument(format!("{var}={v:?}: {why}"));
        if let Some(v) = get("OXCCL_TIMEOUT") {
            let secs: f64 = v
                .trim()
                .parse()
                .map_err(|_| bad("OXCCL_TIMEOUT", &v, "not a number of seconds"))?;
            if !(secs > 0.0 && secs.is_finite()) {
                return Err(bad(
                    "OXCCL_TIMEOUT",
                    &v,
                    "must be a positive number of seconds",
                ));
            }
            c.timeout = Duration::from_secs_f64(secs);
        }
        if let Some(v) = get("OXCCL_ALGO").filter(|v| !v.trim().is_empty()) {
            c.algorithm = Some(
                v.trim()
                    .parse()
                    .map_err(|e| bad("OXCCL_ALGO", &v, &format!("{e}")))?,
            );
        }
        if let Some(v) = get("OXCCL_TRANSPORTS") {
            c.transports = v.parse()?;
        }
        c.socket_ifname = get("OXCCL_SOCKET_IFNAME").filter(|v| !v.trim().is_empty());
        c.host_id = get("OXCCL_HOST_ID").filter(|v| !v.trim().is_empty());
        if let Some(v) = get("OXCCL_SLICE_BYTES") {
            let b: usize = v
                .trim()
                .parse()
                .map_err(|_| bad("OXCCL_SLICE_BYTES", &v, "not a byte count"))?;
            if !(64..=64 << 20).contains(&b) {
                return Err(bad(
                    "OXCCL_SLICE_BYTES",
                    &v,
                    "must be between 64 B and 64 MiB",
                ));
            }
            c.slice_bytes = b;
        }
        if let Some(v) = get("OXCCL_DIRECT_MIN") {
            c.direct_min = match v.trim() {
                "off" => usize::MAX,
                t => t
                    .parse()
                    .map_err(|_| bad("OXCCL_DIRECT_MIN", &v, "not a byte count or `off`"))?,
            };
        }
        if let Some(v) = get("OXCCL_DIRECT_MAX") {
            c.direct_max = v
                .trim()
                .parse()
                .map_err(|_| bad("OXCCL_DIRECT_MAX", &v, "not a byte count"))?;
        }
        if let Some(v) = get("OXCCL_SCRATCH_SLOTS") {
            let s: usize = v
                .trim()
                .parse()
                .map_err(|_| bad("OXCCL_SCRATCH_SLOTS", &v, "not a count"))?;
            if !(1..=64).contains(&s) {
                return Err(bad("OXCCL_SCRATCH_SLOTS", &v, "must be between 1 and 64"));
            }
            c.scratch_slots = s;
        }
        Ok(c)
    }

    /// The same configuration with another deadline.
    pub fn timeout(self, timeout: Duration) -> Config {
        Config { timeout, ..self }
    }

    /// With [`Config::direct_min`] set to `bytes` (`usize::MAX`: never reach peers directly).
    pub fn direct_min(self, bytes: usize) -> Config {
        Config {
            direct_min: bytes,
            ..self
        }
    }

    /// With [`Config::direct_max`] set to `bytes`.
    pub fn direct_max(self, bytes: usize) -> Config {
        Config {
            direct_max: bytes,
            ..self
        }
    }

    /// The same configuration with a forced algorithm.
    pub fn algorithm(self, algorithm: Option<Algorithm>) -> Config {
        Config { algorithm, ..self }
    }

    /// The same configuration with other transports.
    pub fn transports(self, transports: TransportFilter) -> Config {
        Config { transports, ..self }
    }

    /// The same configuration with another slice size.
    pub fn slice_bytes(self, slice_bytes: usize) -> Config {
        Config {
            slice_bytes,
            ..self
        }
    }
}

/// Which transports may carry a communicator's links, in preference order. Parsed from
/// `OXCCL_TRANSPORTS`: a comma-separated list keeps only those, in that order (`tcp`,
/// `shm,tcp`); a leading `^` excludes them instead (`^shm`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransportFilter {
    order: Vec<String>,
}

impl TransportFilter {
    /// Every transport oxccl knows, in the default order of preference: in-process loopback,
    /// shared memory, RDMA, TCP.
    pub const KNOWN: [&'static str; 4] = ["loopback", "shm", "rdma", "tcp"];

    /// Exactly these transports, in this order.
    pub fn only(names: &[&str]) -> TransportFilter {
        TransportFilter {
            order: names.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// The allowed transports, best first.
    pub fn order(&self) -> impl Iterator<Item = &str> {
        self.order.iter().map(String::as_str)
    }

    /// Whether `name` may be used.
    pub fn allows(&self, name: &str) -> bool {
        self.order.iter().any(|n| n == name)
    }
}

impl Default for TransportFilter {
    fn default() -> Self {
        TransportFilter::only(&Self::KNOWN)
    }
}

impl std::str::FromStr for TransportFilter {
    type Err = Error;

    fn from_str(s: &str) -> Result<TransportFilter> {
        let s = s.trim();
        let (exclude, list) = match s.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, s),
        };
        let names: Vec<String> = list
            .split(',')
            .map(|n| n.trim().to_ascii_lowercase())
            .filter(|n| !n.is_empty())
            .collect();
        for n in &names {
            if !Self::KNOWN.contains(&n.as_str()) {
                return Err(Error::InvalidArgument(format!(
                    "OXCCL_TRANSPORTS={s:?}: unknown transport {n:?} (known: {})",
                    Self::KNOWN.join(", ")
                )));
            }
        }
        let order = if exclude {
            Self::KNOWN
                .iter()
                .filter(|k| !names.iter().any(|n| n == *k))
                .map(|k| k.to_string())
                .collect()
        } else {
            names
        };
        if order.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "OXCCL_TRANSPORTS={s:?} leaves no transport"
            )));
        }
        Ok(TransportFilter { order })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn environment_overrides_defaults() {
        let c = Config::from_vars(vars(&[
            ("OXCCL_TIMEOUT", "2.5"),
            ("OXCCL_ALGO", "Ring"),
            ("OXCCL_TRANSPORTS", "^shm"),
            ("OXCCL_SLICE_BYTES", "65536"),
        ]))
        .unwrap();
        assert_eq!(c.timeout, Duration::from_millis(2500));
        assert_eq!(c.algorithm, Some(Algorithm::Ring));
        assert!(!c.transports.allows("shm") && c.transports.allows("tcp"));
        assert_eq!(c.slice_bytes, 65536);
        assert_eq!(Config::from_vars(vars(&[])).unwrap(), Config::default());
    }

    #[test]
    fn bad_values_are_errors_naming_the_variable() {
        for (k, v) in [
            ("OXCCL_TIMEOUT", "soon"),
            ("OXCCL_TIMEOUT", "-1"),
            ("OXCCL_ALGO", "bogus"),
            ("OXCCL_TRANSPORTS", "carrier-pigeon"),
            ("OXCCL_TRANSPORTS", "^loopback,shm,rdma,tcp"),
            ("OXCCL_SLICE_BYTES", "1"),
            ("OXCCL_SCRATCH_SLOTS", "0"),
        ] {
            let e = Config::from_vars(vars(&[(k, v)])).unwrap_err().to_string();
            assert!(e.contains(k), "{e}");
        }
    }

    #[test]
    fn transport_lists_keep_their_order() {
        let f: TransportFilter = "tcp, shm".parse().unwrap();
        assert_eq!(f.order().collect::<Vec<_>>(), vec!["tcp", "shm"]);
    }
}
