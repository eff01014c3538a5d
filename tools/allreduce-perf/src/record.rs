//! The machine-readable results: the JSON document of `-J` (every row with both placements,
//! the configuration, versions, host, times) and the CSV of `--csv` (one line per row and
//! placement). The JSON schema is also what `--overlay` reads and what
//! `scripts/peer2json.py` writes. Serialisation only; the caller owns the files.

use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::args::{Combine, Settings, Step};
use crate::bench::{Measured, Row};
use crate::report::RankInfo;

/// The whole `-J` document.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Doc {
    /// `allreduce-perf` (or the peer's name in converted files).
    pub tool: String,
    /// The tool's version.
    pub version: Option<String>,
    /// The oxccl library's version.
    pub oxccl_version: Option<String>,
    /// A short name for legends (`oxccl all_reduce 2 ranks`).
    pub label: Option<String>,
    /// Host name of rank 0.
    pub host: Option<String>,
    /// The command line.
    pub args: Vec<String>,
    /// When the run started, UTC, RFC 3339.
    pub start_time: Option<String>,
    /// When the run ended, UTC, RFC 3339.
    pub end_time: Option<String>,
    /// What was run.
    pub config: Config,
    /// Each rank's device line.
    pub ranks: Vec<RankRecord>,
    /// Every row.
    pub rows: Vec<RowRecord>,
    /// Mean bus bandwidth over every row and placement, GB/s.
    pub avg_bus_bw: Option<f64>,
    /// Wrong elements over the whole run.
    pub out_of_bounds: Option<u64>,
}

/// The configuration of a run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Config {
    /// nccl-tests' collective name.
    pub collective: String,
    /// Number of ranks.
    pub nranks: usize,
    /// How the ranks were started (`standalone`, or the launcher the bootstrap detected).
    pub launch: String,
    /// `-b`.
    pub min_bytes: u64,
    /// `-e`.
    pub max_bytes: u64,
    /// `-f`, when stepping by a factor.
    pub step_factor: Option<u64>,
    /// `-i`, when stepping by bytes.
    pub step_bytes: Option<u64>,
    /// `-n`.
    pub iters: u64,
    /// `-w`.
    pub warmup_iters: u64,
    /// `-R`.
    pub repeats: u64,
    /// `--min-time`, seconds (0: off).
    pub min_time_s: f64,
    /// `-c`.
    pub check: u32,
    /// `-d`.
    pub datatypes: Vec<String>,
    /// `-o` (empty for collectives that do not reduce).
    pub ops: Vec<String>,
    /// `-r`.
    pub root: usize,
    /// `-z`.
    pub blocking: bool,
    /// `-a`: `rank0`, `avg`, `min` or `max`.
    pub average: String,
    /// The deadline of every wait, seconds.
    pub timeout_s: f64,
    /// `auto` or the forced algorithm.
    pub algo: String,
    /// The allowed transports, in order.
    pub transports: Vec<String>,
    /// `cpu`.
    pub device: String,
}

/// One rank's device line.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RankRecord {
    /// Rank.
    pub rank: usize,
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// Device number (local rank).
    pub device: usize,
    /// Transports to its peers.
    pub transports: Vec<String>,
    /// `auto` or the forced algorithm.
    pub algorithm: String,
}

impl From<&RankInfo> for RankRecord {
    fn from(r: &RankInfo) -> RankRecord {
        RankRecord {
            rank: r.rank,
            host: r.host.clone(),
            pid: r.pid,
            device: r.device,
            transports: r.transports.clone(),
            algorithm: r.algorithm.clone(),
        }
    }
}

/// One row of the table.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RowRecord {
    /// nccl-tests' collective name.
    pub collective: String,
    /// Bytes of the whole logical array.
    pub size: u64,
    /// The count passed to the collective.
    pub count: usize,
    /// nccl-tests' type name.
    #[serde(rename = "type")]
    pub dtype: String,
    /// The operator, or `none`.
    pub redop: String,
    /// The root, or -1.
    pub root: i64,
    /// The algorithm oxccl runs (`p2p` for send/receive).
    pub algorithm: Option<String>,
    /// Separate input and output.
    pub out_of_place: Option<Placed>,
    /// One buffer; `null` where oxccl has no in-place call.
    pub in_place: Option<Placed>,
}

/// One placement of one row.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Placed {
    /// Median over repeats of the mean time per call, µs.
    pub time_us: f64,
    /// Algorithm bandwidth, GB/s.
    pub alg_bw: f64,
    /// Bus bandwidth, GB/s.
    pub bus_bw: f64,
    /// Wrong elements summed over ranks; `null` when unchecked.
    pub nwrong: Option<u64>,
    /// Median single-iteration time, µs.
    pub p50_us: Option<f64>,
    /// 99th-percentile single-iteration time, µs.
    pub p99_us: Option<f64>,
    /// Timed iterations per repeat.
    pub iterations: Option<u64>,
    /// The fastest repeat's mean time per call, µs (`time_us` is their median).
    #[serde(default)]
    pub best_us: Option<f64>,
    /// Each repeat's mean time per call, µs, in the order they ran (the two placements'
    /// alternate: the k-th of each ran side by side).
    #[serde(default)]
    pub repeats_us: Vec<f64>,
}

impl From<&Measured> for Placed {
    fn from(m: &Measured) -> Placed {
        Placed {
            time_us: m.time_us,
            alg_bw: m.alg_bw,
            bus_bw: m.bus_bw,
            nwrong: m.nwrong,
            p50_us: Some(m.p50_us),
            p99_us: Some(m.p99_us),
            iterations: Some(m.iterations),
            // The fastest repeat: where the machine's speed swings between repeats, the time
            // in its fast state.
            best_us: m.repeats_us.iter().copied().reduce(f64::min),
            repeats_us: m.repeats_us.clone(),
        }
    }
}

impl RowRecord {
    /// The record of a measured row.
    pub fn new(row: &Row, oop: Option<&Measured>, ip: Option<&Measured>) -> RowRecord {
        RowRecord {
            collective: row.coll.name().to_owned(),
            size: row.size,
            count: row.count,
            dtype: row.dtype.name().to_owned(),
            redop: row.op.map_or("none", |o| o.name()).to_owned(),
            root: row.root.map_or(-1, |r| r as i64),
            algorithm: Some(row.algorithm.clone()),
            out_of_place: oop.map(Placed::from),
            in_place: ip.map(Placed::from),
        }
    }
}

impl Config {
    /// The configuration of this run.
    pub fn new(
        s: &Settings,
        nranks: usize,
        launch: &str,
        timeout_s: f64,
        algo: &str,
        transports: Vec<String>,
    ) -> Config {
        let (step_factor, step_bytes) = match s.step {
            Step::Factor(f) => (Some(f), None),
            Step::Bytes(b) => (None, Some(b)),
        };
        Config {
            collective: s.coll.name().to_owned(),
            nranks,
            launch: launch.to_owned(),
            min_bytes: s.min_bytes,
            max_bytes: s.max_bytes,
            step_factor,
            step_bytes,
            iters: s.iters,
            warmup_iters: s.warmup,
            repeats: s.repeats,
            min_time_s: s.min_time.map_or(0.0, |t| t.as_secs_f64()),
            check: s.check,
            datatypes: s.dtypes.iter().map(|d| d.name().to_owned()).collect(),
            ops: if s.coll.reduces() {
                s.ops.iter().map(|o| o.name().to_owned()).collect()
            } else {
                Vec::new()
            },
            root: s.root,
            blocking: s.blocking,
            average: match s.combine {
                Combine::Rank0 => "rank0",
                Combine::Average => "avg",
                Combine::Min => "min",
                Combine::Max => "max",
            }
            .to_owned(),
            timeout_s,
            algo: algo.to_owned(),
            transports,
            device: "cpu".to_owned(),
        }
    }
}

/// Writes `doc` as pretty JSON.
pub fn write_json(doc: &Doc, out: &mut impl Write) -> std::io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, doc).map_err(std::io::Error::other)?;
    writeln!(out)
}

/// The CSV header line.
pub const CSV_HEADER: &str = "collective,size,count,type,redop,root,algorithm,placement,time_us,\
                              alg_bw,bus_bw,nwrong,p50_us,p99_us,iterations,best_us";

/// Writes the CSV: a header, then one line per row and measured placement.
pub fn write_csv(rows: &[RowRecord], out: &mut impl Write) -> std::io::Result<()> {
    writeln!(out, "{CSV_HEADER}")?;
    let opt = |v: Option<f64>| v.map_or(String::new(), |v| v.to_string());
    for r in rows {
        for (name, p) in [("out-of-place", &r.out_of_place), ("in-place", &r.in_place)] {
            let Some(p) = p else { continue };
            writeln!(
                out,
                "{},{},{},{},{},{},{},{name},{},{},{},{},{},{},{},{}",
                r.collective,
                r.size,
                r.count,
                r.dtype,
                r.redop,
                r.root,
                r.algorithm.as_deref().unwrap_or(""),
                p.time_us,
                p.alg_bw,
                p.bus_bw,
                p.nwrong.map_or(String::new(), |w| w.to_string()),
                opt(p.p50_us),
                opt(p.p99_us),
                p.iterations.map_or(String::new(), |i| i.to_string()),
                opt(p.best_us),
            )?;
        }
    }
    Ok(())
}

/// Now as UTC RFC 3339 (`2026-11-22T04:40:26Z`).
pub fn now_rfc3339() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    rfc3339(secs)
}

/// `secs` since the Unix epoch as UTC RFC 3339.
fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// The proleptic Gregorian date of `z` days after 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(4_102_444_799), "2099-12-31T23:59:59Z");
    }

    #[test]
    fn csv_has_a_line_per_measured_placement() {
        let placed = Placed {
            time_us: 10.5,
            alg_bw: 0.5,
            bus_bw: 0.5,
            nwrong: Some(0),
            p50_us: Some(10.0),
            p99_us: Some(12.0),
            iterations: Some(20),
            best_us: Some(9.5),
            repeats_us: vec![9.5, 10.5, 11.0],
        };
        let row = RowRecord {
            collective: "gather".into(),
            size: 64,
            count: 8,
            dtype: "float".into(),
            redop: "none".into(),
            root: 0,
            algorithm: Some("direct".into()),
            out_of_place: Some(placed),
            in_place: None,
        };
        let mut out = Vec::new();
        write_csv(&[row], &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].split(',').count(), lines[1].split(',').count());
        assert_eq!(
            lines[1],
            "gather,64,8,float,none,0,direct,out-of-place,10.5,0.5,0.5,0,10,12,20,9.5"
        );
    }
}
