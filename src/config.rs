//! Configuration: a builder with defaults, filled from `OXCCL_*` environment variables by
//! [`Config::from_env`], checked by [`Config::validate`]. Plain data; nothing here opens sockets
//! or reads files beyond the environment.
//!
//! Bad values are errors, never panics or hangs: [`Config::from_vars`] rejects what does not
//! parse and then validates, and creating a communicator validates the configuration it is given,
//! so values set through the builder or the public fields are checked at the same place.

use std::path::PathBuf;
use std::time::Duration;

use crate::algo::{Algorithm, Choice};
use crate::error::{Error, Result};
use crate::tune::Way;

/// Where the tuner's costs come from ([`Config::tune`], `OXCCL_TUNE`). Rank 0's setting and
/// file decide for the whole communicator: it hands its table to the others at creation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Tune {
    /// The defaults measured on the reference machine (`defaults`).
    Defaults,
    /// This host's cached calibration if there is one; else its cached probe (or one this
    /// process made); else, where the ranks share one host and its group area and
    /// [`Config::algorithm`] forces nothing, a probe at creation ([`crate::Calibration::probe`]:
    /// the area's ways timed at a few sizes, the defaults scaled to them; about 1 s on 2 ranks,
    /// 5 s on 8 sharing 2 cores), which rank 0 caches; else the defaults (`cache`). A cached
    /// probe made of fewer than [`crate::PROBE_ROUNDS`] probes is probed again, rank 0 keeping
    /// each point's fastest ([`crate::tune::Costs::fastest_of`]), so a host's first three
    /// processes probe. Where [`Config::tune_file`] names a file, that file or the defaults.
    /// The probe's calls are not the caller's: its first call is collective #0, and the flight
    /// recorder holds only the caller's calls.
    #[default]
    Cache,
    /// As `cache`, but when no calibration is cached the ranks calibrate at creation (about 7 s
    /// on 2 ranks) and rank 0 caches the result (`calibrate`).
    Calibrate,
    /// A probe at creation whatever is cached (where a probe can be made, as for `cache`),
    /// cached by rank 0 unless [`Config::tune_file`] names a file (`probe`); joined with the
    /// cached probe as under `cache` while that one is made of fewer than
    /// [`crate::PROBE_ROUNDS`], else the count starts over.
    Probe,
}

/// How a communicator behaves. Every field has a default; [`Config::from_env`] overrides them
/// from the environment. The allowed ranges are checked by [`Config::validate`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Deadline of every wait: a collective, a connection, a store lookup (`OXCCL_TIMEOUT`,
    /// seconds; default 300; from [`Config::MIN_TIMEOUT`] to [`Config::MAX_TIMEOUT`]).
    pub timeout: Duration,
    /// How long a peer may stay silent before it is declared failed (`OXCCL_HEARTBEAT`,
    /// seconds; default 2; `0` or `off`: no heartbeats; from [`Config::MIN_HEARTBEAT`] to
    /// [`Config::MAX_TIMEOUT`]). Every rank's process sends small authenticated datagrams to
    /// its neighbours five times per period from a thread of its own, so a peer that vanished,
    /// hangs in the kernel or was stopped fails the others' running call — or their next one,
    /// when idle — with [`crate::Error::PeerFailed`] naming it, within this bound.
    pub heartbeat: Option<Duration>,
    /// Forces an algorithm where it applies (`OXCCL_ALGO`: ring, tree, hd, direct, hierarchical).
    pub algorithm: Option<Algorithm>,
    /// Which transports may be used, in preference order (`OXCCL_TRANSPORTS`): at least one,
    /// each among [`TransportFilter::KNOWN`], none twice.
    pub transports: TransportFilter,
    /// Interfaces for TCP (`OXCCL_SOCKET_IFNAME`, NCCL_SOCKET_IFNAME syntax).
    pub socket_ifname: Option<String>,
    /// Which RDMA devices and ports may carry the rdma transport (`OXCCL_IB_HCA`, with
    /// NCCL_IB_HCA's syntax: `mlx5_0:1,mlx5_1`, `^mlx5_1` to exclude, `=` for exact names).
    pub ib_hca: Option<String>,
    /// The GID table entry of a RoCE port (`OXCCL_IB_GID_INDEX`, 0 to 255; default: a RoCE v2
    /// entry holding an IPv4 address, as NCCL picks).
    pub ib_gid_index: Option<u8>,
    /// This process's host identity, overriding discovery (`OXCCL_HOST_ID`; not empty, at most
    /// [`Config::MAX_HOST_ID_BYTES`]).
    pub host_id: Option<String>,
    /// Largest message, in bytes: collectives are cut into slices of this size
    /// (`OXCCL_SLICE_BYTES`; default 256 KiB; from [`Config::MIN_SLICE_BYTES`] to
    /// [`Config::MAX_SLICE_BYTES`]).
    pub slice_bytes: usize,
    /// Scratch slots per pipeline (`OXCCL_SCRATCH_SLOTS`; default 4; from 1 to
    /// [`Config::MAX_SCRATCH_SLOTS`]): scratch memory per communicator is at most a few times
    /// `slice_bytes × scratch_slots`.
    pub scratch_slots: usize,
    /// Fixes the all-reduce's choice between ranks of one host by size instead of the tuner's
    /// costs (`OXCCL_DIRECT_MIN`, bytes, or `off`; default `None`, the tuner decides): from
    /// this many bytes up to [`Config::direct_max`] (any size in place) ranks read and write
    /// each other's memory directly when every rank can; the others go through the shared
    /// group area. Ranks whose thresholds differ agree at each call: direct only if every rank
    /// would; but a rank with the fixed rule (this or [`Config::direct_max`] set) beside one
    /// without fails creation, naming it.
    pub direct_min: Option<usize>,
    /// The largest out-of-place all-reduce, in bytes, that reaches peers' memory directly
    /// under the fixed rule of [`Config::direct_min`] (`OXCCL_DIRECT_MAX`; default `None`:
    /// the tuner decides, or [`Config::DEFAULT_DIRECT_MAX`] if only `direct_min` is set).
    pub direct_max: Option<usize>,
    /// Fixes the choice for all-gathers, reduce-scatters, broadcasts and reduces between
    /// ranks of one host: those whose per-rank block (the message, for broadcast and reduce)
    /// has at least this many bytes reach peers' memory directly by system calls, one copy per
    /// byte, when every rank can; the others are staged through the shared group area
    /// (`OXCCL_DIRECT_COPY_MIN`, bytes, or `off`; default `None`: the tuner decides). Must be
    /// the same on every rank: creation fails naming a rank that differs.
    pub direct_copy_min: Option<usize>,
    /// Forces one way through the shared group area wherever the call can take it
    /// (`OXCCL_AREA_WAY`: one-shot, two-shot, direct, staged); for measuring the ways against
    /// each other. Must be the same on every rank: creation fails naming a rank that differs.
    pub area_way: Option<Way>,
    /// Where the tuner's costs come from (`OXCCL_TUNE`; default [`Tune::Cache`]).
    pub tune: Tune,
    /// The file that caches this host's calibration (`OXCCL_TUNE_FILE`; default
    /// `$XDG_CACHE_HOME/oxccl/` or `~/.cache/oxccl/`, one file per host, rank count and
    /// library version). Read and written by rank 0 only.
    pub tune_file: Option<PathBuf>,
    /// A whole job's topology to use instead of discovering it (`OXCCL_TOPO_FILE`, the JSON
    /// that `OXCCL_TOPO_DUMP_FILE` writes): the hosts, NUMA nodes, NICs and GPUs the tuner
    /// sees. Set it on every rank, with one place per rank.
    pub topo_file: Option<PathBuf>,
    /// Where rank 0 writes the job's topology as JSON after creation (`OXCCL_TOPO_DUMP_FILE`).
    pub topo_dump_file: Option<PathBuf>,
    /// The NVML library discovery asks about NVLinks and peer-to-peer reachability where the
    /// host has NVIDIA GPUs (`OXCCL_NVML_LIBRARY`: a path or a name for the dynamic loader;
    /// default [`Config::DEFAULT_NVML_LIBRARY`]; `none`: do not load NVML).
    pub nvml_library: Option<PathBuf>,
    /// Calls the flight recorder keeps per communicator (`OXCCL_TRACE_ENTRIES`; default
    /// [`crate::trace::DEFAULT_ENTRIES`]; 0 turns it off; at most
    /// [`crate::trace::MAX_ENTRIES`]). See [`crate::trace`].
    pub trace_entries: usize,
    /// Where the flight recorder writes its dumps (`OXCCL_TRACE_DIR`; default
    /// `$TMPDIR/oxccl-trace-<uid>`).
    pub trace_dir: Option<PathBuf>,
    /// Whether SIGUSR1 dumps every communicator's flight recorder (`OXCCL_TRACE_SIGNAL`,
    /// `0`/`off` to leave SIGUSR1 alone; default on).
    pub trace_signal: bool,
    /// Who keeps the store server of a [`crate::bootstrap::UniqueId`] made in this process
    /// (`OXCCL_UNIQUE_ID_SERVER`): `process` (default), the process until it exits, so the id
    /// may be used again and shrinks may meet there after rank 0 left; `comm`, the
    /// communicator of rank 0 made from it in this process (and its splits): the server stops
    /// once they are all dropped and every rank has finished its setup, so making many
    /// communicators leaves no thread or socket behind (the torch backend's point-to-point
    /// communicators use it).
    pub unique_id_server_with_comm: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            timeout: Duration::from_secs(300),
            heartbeat: Some(Self::DEFAULT_HEARTBEAT),
            algorithm: None,
            transports: TransportFilter::default(),
            socket_ifname: None,
            ib_hca: None,
            ib_gid_index: None,
            host_id: None,
            slice_bytes: Choice::DEFAULT_SLICE_BYTES,
            scratch_slots: Choice::DEFAULT_SCRATCH_SLOTS,
            direct_min: None,
            direct_max: None,
            direct_copy_min: None,
            area_way: None,
            tune: Tune::Cache,
            tune_file: None,
            topo_file: None,
            topo_dump_file: None,
            nvml_library: Some(PathBuf::from(Self::DEFAULT_NVML_LIBRARY)),
            trace_entries: crate::trace::DEFAULT_ENTRIES,
            trace_dir: None,
            trace_signal: true,
            unique_id_server_with_comm: false,
        }
    }
}

impl Config {
    /// [`Config::direct_min`] when only [`Config::direct_max`] is set.
    pub const DEFAULT_DIRECT_MIN: usize = 16 << 10;
    /// [`Config::direct_max`] when only [`Config::direct_min`] is set.
    pub const DEFAULT_DIRECT_MAX: usize = 4 << 20;

    /// Default of [`Config::nvml_library`]: the name NVIDIA's driver installs, as NCCL loads it.
    pub const DEFAULT_NVML_LIBRARY: &'static str = "libnvidia-ml.so.1";

    /// Default of [`Config::heartbeat`].
    pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(2);
    /// Shortest [`Config::heartbeat`].
    pub const MIN_HEARTBEAT: Duration = Duration::from_millis(100);
    /// The shortest [`Config::timeout`].
    pub const MIN_TIMEOUT: Duration = Duration::from_millis(1);
    /// The longest [`Config::timeout`]: one year (31 536 000 s). Deadlines are computed as
    /// `Instant::now() + timeout`; a year is far from where that can overflow, so no deadline
    /// arithmetic anywhere can panic.
    pub const MAX_TIMEOUT: Duration = Duration::from_secs(31_536_000);
    /// The smallest [`Config::slice_bytes`].
    pub const MIN_SLICE_BYTES: usize = 64;
    /// The largest [`Config::slice_bytes`]: 64 MiB.
    pub const MAX_SLICE_BYTES: usize = 64 << 20;
    /// The most [`Config::scratch_slots`] (the fewest is 1).
    pub const MAX_SCRATCH_SLOTS: usize = 64;
    /// The longest [`Config::host_id`], in bytes: it travels in a 16-bit length field, and no
    /// real host name comes near it.
    pub const MAX_HOST_ID_BYTES: usize = 1024;

    /// Defaults overridden by the `OXCCL_*` variables present in the environment; an error names
    /// a variable that does not parse or is out of range.
    pub fn from_env() -> Result<Config> {
        Config::from_env_with(|_| None)
    }

    /// [`Config::from_env`] with the values `overrides` returns in place of those variables'
    /// (a communicator's own settings: the C ABI's `oxcclCommInitRankOptions`); it is asked
    /// for every variable read.
    pub fn from_env_with(overrides: impl Fn(&str) -> Option<String>) -> Result<Config> {
        with_env(|get| Config::from_vars(|k| overrides(k).or_else(|| get(k))))
    }

    /// Defaults overridden by the variables `get` returns (for tests), then
    /// [validated](Config::validate). Never panics, whatever the strings.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let mut c = Config::default();
        let bad =
            |var: &str, v: &str, why: &str| Error::InvalidArgument(format!("{var}={v:?}: {why}"));
        if let Some(v) = get("OXCCL_TIMEOUT") {
            let why = "not a number of seconds from 0.001 to 31536000 (one year)";
            let secs: f64 = v
                .trim()
                .parse()
                .map_err(|_| bad("OXCCL_TIMEOUT", &v, why))?;
            // The checked conversion: negative, NaN, infinite and overflowing values are errors
            // here; the range itself is checked by `validate`.
            c.timeout =
                Duration::try_from_secs_f64(secs).map_err(|_| bad("OXCCL_TIMEOUT", &v, why))?;
        }
        if let Some(v) = get("OXCCL_HEARTBEAT").filter(|v| !v.trim().is_empty()) {
            let why = "not a number of seconds from 0.1 to 31536000, or 0/off";
            if v.trim().eq_ignore_ascii_case("off") {
                c.heartbeat = None;
            } else {
                let secs: f64 = v
                    .trim()
                    .parse()
                    .map_err(|_| bad("OXCCL_HEARTBEAT", &v, why))?;
                let d = Duration::try_from_secs_f64(secs)
                    .map_err(|_| bad("OXCCL_HEARTBEAT", &v, why))?;
                // Only a zero turns heartbeats off; a value that rounds to 0 ns is out of
                // range (`validate`), not off.
                c.heartbeat = if secs == 0.0 {
                    None
                } else {
                    Some(d.max(Duration::from_nanos(1)))
                };
            }
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
        c.ib_hca = get("OXCCL_IB_HCA").filter(|v| !v.trim().is_empty());
        if let Some(v) = get("OXCCL_IB_GID_INDEX").filter(|v| !v.trim().is_empty()) {
            c.ib_gid_index = Some(
                v.trim()
                    .parse()
                    .map_err(|_| bad("OXCCL_IB_GID_INDEX", &v, "not a GID index from 0 to 255"))?,
            );
        }
        c.host_id = get("OXCCL_HOST_ID").filter(|v| !v.trim().is_empty());
        let number = |var: &str, v: &str, what: &str| -> Result<usize> {
            v.trim().parse().map_err(|_| bad(var, v, what))
        };
        if let Some(v) = get("OXCCL_SLICE_BYTES") {
            c.slice_bytes = number("OXCCL_SLICE_BYTES", &v, "not a byte count")?;
        }
        if let Some(v) = get("OXCCL_DIRECT_MIN") {
            c.direct_min = Some(if v.trim().eq_ignore_ascii_case("off") {
                usize::MAX
            } else {
                number("OXCCL_DIRECT_MIN", &v, "not a byte count or `off`")?
            });
        }
        if let Some(v) = get("OXCCL_DIRECT_COPY_MIN") {
            c.direct_copy_min = Some(if v.trim().eq_ignore_ascii_case("off") {
                usize::MAX
            } else {
                number("OXCCL_DIRECT_COPY_MIN", &v, "not a byte count or `off`")?
            });
        }
        if let Some(v) = get("OXCCL_DIRECT_MAX") {
            c.direct_max = Some(number("OXCCL_DIRECT_MAX", &v, "not a byte count")?);
        }
        if let Some(v) = get("OXCCL_AREA_WAY").filter(|v| !v.trim().is_empty()) {
            let way = Way::ALL
                .into_iter()
                .find(|w| w.name().eq_ignore_ascii_case(v.trim()));
            c.area_way = Some(way.ok_or_else(|| {
                bad(
                    "OXCCL_AREA_WAY",
                    &v,
                    "not one-shot, two-shot, direct or staged",
                )
            })?);
        }
        if let Some(v) = get("OXCCL_TUNE").filter(|v| !v.trim().is_empty()) {
            c.tune = match v.trim().to_ascii_lowercase().as_str() {
                "defaults" => Tune::Defaults,
                "cache" => Tune::Cache,
                "calibrate" => Tune::Calibrate,
                "probe" => Tune::Probe,
                _ => {
                    return Err(bad(
                        "OXCCL_TUNE",
                        &v,
                        "not defaults, cache, calibrate or probe",
                    ));
                }
            };
        }
        c.tune_file = get("OXCCL_TUNE_FILE")
            .filter(|v| !v.trim().is_empty())
            .map(PathBuf::from);
        c.topo_file = get("OXCCL_TOPO_FILE")
            .filter(|v| !v.trim().is_empty())
            .map(PathBuf::from);
        c.topo_dump_file = get("OXCCL_TOPO_DUMP_FILE")
            .filter(|v| !v.trim().is_empty())
            .map(PathBuf::from);
        if let Some(v) = get("OXCCL_NVML_LIBRARY").filter(|v| !v.trim().is_empty()) {
            c.nvml_library = match v.trim() {
                n if n.eq_ignore_ascii_case("none") || n.eq_ignore_ascii_case("off") => None,
                n => Some(PathBuf::from(n)),
            };
        }
        if let Some(v) = get("OXCCL_TRACE_ENTRIES") {
            c.trace_entries = number("OXCCL_TRACE_ENTRIES", &v, "not a count")?;
        }
        c.trace_dir = get("OXCCL_TRACE_DIR")
            .filter(|v| !v.trim().is_empty())
            .map(PathBuf::from);
        if let Some(v) = get("OXCCL_TRACE_SIGNAL").filter(|v| !v.trim().is_empty()) {
            c.trace_signal = match v.trim().to_ascii_lowercase().as_str() {
                "1" | "on" | "true" | "yes" => true,
                "0" | "off" | "false" | "no" => false,
                _ => return Err(bad("OXCCL_TRACE_SIGNAL", &v, "not on/1 or off/0")),
            };
        }
        if let Some(v) = get("OXCCL_SCRATCH_SLOTS") {
            c.scratch_slots = number("OXCCL_SCRATCH_SLOTS", &v, "not a count")?;
        }
        if let Some(v) = get("OXCCL_UNIQUE_ID_SERVER").filter(|v| !v.trim().is_empty()) {
            c.unique_id_server_with_comm = match v.trim() {
                "process" => false,
                "comm" => true,
                _ => return Err(bad("OXCCL_UNIQUE_ID_SERVER", &v, "not process or comm")),
            };
        }
        c.validate()?;
        Ok(c)
    }

    /// Checks every field against its allowed range; creating a communicator calls it, and so
    /// does [`Config::from_vars`]. The error names the field, its variable and the range.
    ///
    /// [`Config::direct_min`] and [`Config::direct_max`] are thresholds: every value is allowed
    /// (a `direct_min` above `direct_max` turns the direct path off).
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &str, var: &str, value: &dyn std::fmt::Debug, why: String| {
            Error::InvalidArgument(format!("{field} ({var}) is {value:?}: {why}"))
        };
        if let Some(h) = &self.ib_hca
            && let Err(why) = oxccl_transport_rdma::device::HcaFilter::parse(h)
        {
            return Err(bad("ib_hca", "OXCCL_IB_HCA", h, why));
        }
        if !(Self::MIN_TIMEOUT..=Self::MAX_TIMEOUT).contains(&self.timeout) {
            return Err(bad(
                "timeout",
                "OXCCL_TIMEOUT",
                &self.timeout,
                "must be from 1 ms to 31536000 s (one year), so that no deadline overflows".into(),
            ));
        }
        if let Some(h) = self.heartbeat
            && !(Self::MIN_HEARTBEAT..=Self::MAX_TIMEOUT).contains(&h)
        {
            return Err(bad(
                "heartbeat",
                "OXCCL_HEARTBEAT",
                &h,
                "must be from 0.1 s to 31536000 s, or off".into(),
            ));
        }
        if !(Self::MIN_SLICE_BYTES..=Self::MAX_SLICE_BYTES).contains(&self.slice_bytes) {
            return Err(bad(
                "slice_bytes",
                "OXCCL_SLICE_BYTES",
                &self.slice_bytes,
                "must be from 64 B to 64 MiB (67108864)".into(),
            ));
        }
        if !(1..=Self::MAX_SCRATCH_SLOTS).contains(&self.scratch_slots) {
            return Err(bad(
                "scratch_slots",
                "OXCCL_SCRATCH_SLOTS",
                &self.scratch_slots,
                format!("must be from 1 to {}", Self::MAX_SCRATCH_SLOTS),
            ));
        }
        if let Some(h) = &self.host_id
            && (h.trim().is_empty() || h.len() > Self::MAX_HOST_ID_BYTES)
        {
            return Err(bad(
                "host_id",
                "OXCCL_HOST_ID",
                &h.chars().take(64).collect::<String>(),
                format!(
                    "must not be blank and at most {} bytes long (this one has {})",
                    Self::MAX_HOST_ID_BYTES,
                    h.len()
                ),
            ));
        }
        if self.trace_entries > crate::trace::MAX_ENTRIES {
            return Err(bad(
                "trace_entries",
                "OXCCL_TRACE_ENTRIES",
                &self.trace_entries,
                format!("must be at most {}", crate::trace::MAX_ENTRIES),
            ));
        }
        self.transports.validate()
    }

    /// The same configuration with another deadline. One outside [`Config::MIN_TIMEOUT`] ..=
    /// [`Config::MAX_TIMEOUT`] is rejected when a communicator is created.
    pub fn timeout(self, timeout: Duration) -> Config {
        Config { timeout, ..self }
    }

    /// With [`Config::direct_min`] set to `bytes` (`usize::MAX`: never reach peers directly).
    /// Every value is allowed.
    pub fn direct_min(self, bytes: usize) -> Config {
        Config {
            direct_min: Some(bytes),
            ..self
        }
    }

    /// With [`Config::direct_copy_min`] set to `bytes` (`usize::MAX`: never). Every value is
    /// allowed.
    pub fn direct_copy_min(self, bytes: usize) -> Config {
        Config {
            direct_copy_min: Some(bytes),
            ..self
        }
    }

    /// With [`Config::direct_max`] set to `bytes`. Every value is allowed.
    pub fn direct_max(self, bytes: usize) -> Config {
        Config {
            direct_max: Some(bytes),
            ..self
        }
    }

    /// The settings that choose how calls travel, as `(variable, value)`: every rank of a
    /// communicator must share them, and creation fails naming the first that differs between
    /// two ranks (`comm::setup`). With different slice sizes, scratch slots, forced algorithms,
    /// thresholds or ways, ranks would cut one call into different messages or send it
    /// different ways, which the descriptors exchanged per call do not always tell apart: a
    /// scratch-slot count that differs reorders an in-place ring's messages with identical
    /// descriptors, silently wrong. Settings that may differ (the deadline, heartbeats, where
    /// costs come from: rank 0 hands out its table) are not here. `OXCCL_TOPO_FILE`'s value
    /// is the loaded topology's digest, set by creation.
    pub(crate) fn routing_settings(&self) -> Vec<(&'static str, String)> {
        let bytes = |v: Option<usize>| match v {
            None => "default".to_string(),
            Some(usize::MAX) => "off".to_string(),
            Some(b) => b.to_string(),
        };
        vec![
            ("oxccl version", env!("CARGO_PKG_VERSION").to_string()),
            (
                "OXCCL_ALGO",
                self.algorithm
                    .map_or("auto".into(), |a| a.name().to_string()),
            ),
            // Without `loopback`, which joins only threads of one process (one `Config`):
            // `shm,rdma,tcp` on one host and the default on another route alike.
            (
                "OXCCL_TRANSPORTS",
                self.transports
                    .order()
                    .filter(|t| *t != "loopback")
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            ("OXCCL_SLICE_BYTES", self.slice_bytes.to_string()),
            ("OXCCL_SCRATCH_SLOTS", self.scratch_slots.to_string()),
            // Their values may differ (ranks agree per call: direct only if every rank would),
            // but not whether the fixed rule replaces the tuner's choice.
            (
                "OXCCL_DIRECT_MIN/OXCCL_DIRECT_MAX",
                if self.direct_min.is_some() || self.direct_max.is_some() {
                    "set (a fixed rule)".into()
                } else {
                    "unset (the tuner decides)".into()
                },
            ),
            ("OXCCL_DIRECT_COPY_MIN", bytes(self.direct_copy_min)),
            (
                "OXCCL_AREA_WAY",
                self.area_way
                    .map_or("auto".into(), |w| w.name().to_string()),
            ),
        ]
    }

    /// With [`Config::area_way`] set.
    pub fn area_way(self, area_way: Option<Way>) -> Config {
        Config { area_way, ..self }
    }

    /// With [`Config::heartbeat`] set (`None`: no heartbeats).
    pub fn heartbeat(self, heartbeat: Option<Duration>) -> Config {
        Config { heartbeat, ..self }
    }

    /// With [`Config::trace_entries`] set.
    pub fn trace_entries(self, trace_entries: usize) -> Config {
        Config {
            trace_entries,
            ..self
        }
    }

    /// With [`Config::trace_dir`] set.
    pub fn trace_dir(self, trace_dir: Option<PathBuf>) -> Config {
        Config { trace_dir, ..self }
    }

    /// With [`Config::trace_signal`] set.
    pub fn trace_signal(self, trace_signal: bool) -> Config {
        Config {
            trace_signal,
            ..self
        }
    }

    /// With [`Config::tune`] set.
    pub fn tune(self, tune: Tune) -> Config {
        Config { tune, ..self }
    }

    /// With [`Config::tune_file`] set.
    pub fn tune_file(self, path: Option<PathBuf>) -> Config {
        Config {
            tune_file: path,
            ..self
        }
    }

    /// With [`Config::topo_file`] set.
    pub fn topo_file(self, path: Option<PathBuf>) -> Config {
        Config {
            topo_file: path,
            ..self
        }
    }

    /// With [`Config::nvml_library`] set.
    pub fn nvml_library(self, library: Option<PathBuf>) -> Config {
        Config {
            nvml_library: library,
            ..self
        }
    }

    /// With [`Config::topo_dump_file`] set.
    pub fn topo_dump_file(self, path: Option<PathBuf>) -> Config {
        Config {
            topo_dump_file: path,
            ..self
        }
    }

    /// The same configuration with a forced algorithm.
    pub fn algorithm(self, algorithm: Option<Algorithm>) -> Config {
        Config { algorithm, ..self }
    }

    /// The same configuration with other transports. An empty list, an unknown name or one
    /// named twice is rejected when a communicator is created.
    pub fn transports(self, transports: TransportFilter) -> Config {
        Config { transports, ..self }
    }

    /// The same configuration with another slice size. One outside
    /// [`Config::MIN_SLICE_BYTES`] ..= [`Config::MAX_SLICE_BYTES`] is rejected when a
    /// communicator is created.
    pub fn slice_bytes(self, slice_bytes: usize) -> Config {
        Config {
            slice_bytes,
            ..self
        }
    }

    /// The same configuration with another scratch depth. One outside 1 ..=
    /// [`Config::MAX_SCRATCH_SLOTS`] is rejected when a communicator is created.
    pub fn scratch_slots(self, scratch_slots: usize) -> Config {
        Config {
            scratch_slots,
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

    /// Checks that at least one transport is left, each is known and none is named twice
    /// ([`TransportFilter::only`] takes any names; this is where they are checked).
    fn validate(&self) -> Result<()> {
        let bad = |why: String| {
            Error::InvalidArgument(format!(
                "transports (OXCCL_TRANSPORTS) is {:?}: {why}",
                self.order
            ))
        };
        if self.order.is_empty() {
            return Err(bad("no transport is left".into()));
        }
        for (i, n) in self.order.iter().enumerate() {
            if !Self::KNOWN.contains(&n.as_str()) {
                return Err(bad(format!(
                    "unknown transport {n:?} (known: {})",
                    Self::KNOWN.join(", ")
                )));
            }
            if self.order[..i].contains(n) {
                return Err(bad(format!("{n:?} is named twice")));
            }
        }
        Ok(())
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

/// Runs `read` over the process environment, with one rule for every `OXCCL_*` variable it
/// asks for: a value that is not UTF-8 is an error naming the variable (not taken for unset,
/// which would quietly give the default — a garbled `OXCCL_TIMEOUT` became 300 s).
pub(crate) fn with_env<T>(
    read: impl FnOnce(&dyn Fn(&str) -> Option<String>) -> Result<T>,
) -> Result<T> {
    let garbled = std::cell::RefCell::new(None::<String>);
    let get = |k: &str| match std::env::var(k) {
        Ok(v) => Some(v),
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(_)) => {
            garbled.borrow_mut().get_or_insert_with(|| k.to_owned());
            None
        }
    };
    let out = read(&get);
    match garbled.into_inner() {
        Some(k) => Err(Error::InvalidArgument(format!(
            "{k}: its value is not valid UTF-8 (oxccl reads its settings as UTF-8 text)"
        ))),
        None => out,
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
        let c = Config::from_vars(vars(&[
            ("OXCCL_TRACE_ENTRIES", "0"),
            ("OXCCL_TRACE_DIR", "/tmp/x"),
            ("OXCCL_TRACE_SIGNAL", "off"),
            ("OXCCL_UNIQUE_ID_SERVER", " comm "),
        ]))
        .unwrap();
        assert!(c.unique_id_server_with_comm);
        assert!(!Config::default().unique_id_server_with_comm);
        assert_eq!(c.heartbeat, Some(Config::DEFAULT_HEARTBEAT));
        for (v, want) in [("0", None), ("off", None), ("0.5", Some(500))] {
            let c = Config::from_vars(vars(&[("OXCCL_HEARTBEAT", v)])).unwrap();
            assert_eq!(c.heartbeat, want.map(Duration::from_millis), "{v}");
        }
        assert_eq!(
            (c.trace_entries, c.trace_dir.as_deref(), c.trace_signal),
            (0, Some(std::path::Path::new("/tmp/x")), false)
        );
    }

    #[test]
    fn bad_values_are_errors_naming_the_variable() {
        for (k, v) in [
            ("OXCCL_TIMEOUT", "soon"),
            ("OXCCL_TIMEOUT", "-1"),
            ("OXCCL_TIMEOUT", "0"),
            ("OXCCL_TIMEOUT", "0.0009"),
            ("OXCCL_TIMEOUT", "31536000.5"),
            ("OXCCL_TIMEOUT", "1e20"),
            ("OXCCL_TIMEOUT", "NaN"),
            ("OXCCL_TIMEOUT", "inf"),
            ("OXCCL_ALGO", "bogus"),
            ("OXCCL_TRACE_ENTRIES", "1048577"),
            ("OXCCL_TRACE_ENTRIES", "-1"),
            ("OXCCL_TRACE_ENTRIES", "many"),
            ("OXCCL_TRACE_SIGNAL", "maybe"),
            ("OXCCL_HEARTBEAT", "0.05"),
            ("OXCCL_HEARTBEAT", "1e-10"),
            ("OXCCL_HEARTBEAT", "-1"),
            ("OXCCL_HEARTBEAT", "soon"),
            ("OXCCL_TRANSPORTS", "carrier-pigeon"),
            ("OXCCL_TRANSPORTS", "^loopback,shm,rdma,tcp"),
            ("OXCCL_TRANSPORTS", "shm,tcp,shm"),
            ("OXCCL_SLICE_BYTES", "1"),
            ("OXCCL_SLICE_BYTES", "67108865"),
            ("OXCCL_SCRATCH_SLOTS", "0"),
            ("OXCCL_SCRATCH_SLOTS", "65"),
            ("OXCCL_DIRECT_MIN", "-1"),
            ("OXCCL_DIRECT_MAX", "lots"),
            ("OXCCL_IB_HCA", "^"),
            ("OXCCL_IB_HCA", "mlx5_0:0"),
            ("OXCCL_IB_HCA", "mlx5 0"),
            ("OXCCL_IB_GID_INDEX", "256"),
            ("OXCCL_IB_GID_INDEX", "-1"),
            ("OXCCL_IB_GID_INDEX", "auto"),
            ("OXCCL_UNIQUE_ID_SERVER", "sometimes"),
        ] {
            let e = Config::from_vars(vars(&[(k, v)])).unwrap_err().to_string();
            assert!(e.contains(k), "{e}");
        }
    }

    #[test]
    fn rdma_device_variables_are_read() {
        let c = Config::from_vars(vars(&[
            ("OXCCL_IB_HCA", "^=mlx5_1"),
            ("OXCCL_IB_GID_INDEX", " 3 "),
        ]))
        .unwrap();
        assert_eq!(c.ib_hca.as_deref(), Some("^=mlx5_1"));
        assert_eq!(c.ib_gid_index, Some(3));
        let c = Config::default();
        assert_eq!((c.ib_hca, c.ib_gid_index), (None, None));
    }

    #[test]
    fn the_range_ends_are_accepted_and_the_longest_deadline_does_not_overflow() {
        let c = Config::from_vars(vars(&[
            ("OXCCL_TIMEOUT", "0.001"),
            ("OXCCL_SLICE_BYTES", "64"),
            ("OXCCL_SCRATCH_SLOTS", "64"),
            ("OXCCL_DIRECT_MIN", "off"),
            ("OXCCL_DIRECT_MAX", "18446744073709551615"),
        ]))
        .unwrap();
        assert_eq!(c.timeout, Config::MIN_TIMEOUT);
        assert_eq!(c.direct_min, Some(usize::MAX));
        let c = Config::from_vars(vars(&[
            ("OXCCL_TIMEOUT", "31536000"),
            ("OXCCL_SLICE_BYTES", "67108864"),
            ("OXCCL_SCRATCH_SLOTS", "1"),
        ]))
        .unwrap();
        assert_eq!(c.timeout, Config::MAX_TIMEOUT);
        let _ = std::time::Instant::now() + c.timeout;
    }

    #[test]
    fn validate_checks_what_the_builder_and_the_fields_set() {
        assert!(Config::default().validate().is_ok());
        let host = |h: &str| Config {
            host_id: Some(h.into()),
            ..Config::default()
        };
        for (c, field) in [
            (Config::default().timeout(Duration::ZERO), "timeout"),
            (Config::default().timeout(Duration::MAX), "timeout"),
            (Config::default().slice_bytes(0), "slice_bytes"),
            (Config::default().slice_bytes(usize::MAX), "slice_bytes"),
            (Config::default().scratch_slots(0), "scratch_slots"),
            (host(" "), "host_id"),
            (host(&"h".repeat(Config::MAX_HOST_ID_BYTES + 1)), "host_id"),
            (
                Config::default().transports(TransportFilter::only(&[])),
                "transports",
            ),
            (
                Config::default().transports(TransportFilter::only(&["pigeon"])),
                "transports",
            ),
            (
                Config::default().transports(TransportFilter::only(&["tcp", "tcp"])),
                "transports",
            ),
        ] {
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
    }

    #[test]
    fn transport_lists_keep_their_order() {
        let f: TransportFilter = "tcp, shm".parse().unwrap();
        assert_eq!(f.order().collect::<Vec<_>>(), vec!["tcp", "shm"]);
    }
}
