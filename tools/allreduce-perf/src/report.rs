//! The nccl-tests table, reproduced line for line in layout: header, device lines, column
//! headers, one line per row with out-of-place and in-place columns, and the footer. Functions
//! return text; the caller decides where it goes. The C format strings they follow are quoted
//! beside each one.

use crate::args::{Settings, Step};
use crate::bench::{Measured, Row};
use crate::cfmt;

/// What one rank says about itself in the device lines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankInfo {
    /// Rank.
    pub rank: usize,
    /// Host name (up to the first dot, as nccl-tests prints it).
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// Local rank, shown as the device number.
    pub device: usize,
    /// Transports to its peers, distinct, in first-use order (empty on one rank).
    pub transports: Vec<String>,
    /// `auto` or the forced algorithm.
    pub algorithm: String,
}

impl RankInfo {
    /// The device description: transports and algorithm (`tcp; algorithm auto`).
    pub fn description(&self) -> String {
        let t = if self.transports.is_empty() {
            "self".to_owned()
        } else {
            self.transports.join(",")
        };
        format!("{t}; algorithm {}", self.algorithm)
    }

    /// Encodes for the gather to rank 0 (tab-separated; no field holds a tab).
    pub fn encode(&self) -> String {
        format!(
            "{}\t{}\t{}\t{}\t{}\t{}",
            self.rank,
            self.host.replace('\t', " "),
            self.pid,
            self.device,
            self.transports.join(","),
            self.algorithm
        )
    }

    /// Decodes what [`RankInfo::encode`] wrote; `None` when malformed.
    pub fn decode(s: &str) -> Option<RankInfo> {
        let f: Vec<&str> = s.split('\t').collect();
        if f.len() != 6 {
            return None;
        }
        Some(RankInfo {
            rank: f[0].parse().ok()?,
            host: f[1].to_owned(),
            pid: f[2].parse().ok()?,
            device: f[3].parse().ok()?,
            transports: f[4]
                .split(',')
                .filter(|t| !t.is_empty())
                .map(str::to_owned)
                .collect(),
            algorithm: f[5].to_owned(),
        })
    }
}

/// The lines before the device lines: version, test name, parameters, `-z 1`'s notice,
/// `#`, `# Using devices`.
pub fn header(s: &Settings, version: &str) -> String {
    let (step, unit) = match s.step {
        Step::Factor(f) => (f, "factor"),
        Step::Bytes(b) => (b, "bytes"),
    };
    let mut out = format!("# oxccl allreduce-perf version {version} (nccl-tests layout)\n");
    out += &format!("# Collective test starting: {}_perf\n", s.coll.name());
    // "# nThread %d nGpus %d minBytes %ld maxBytes %ld step: %ld(%s) warmup iters: %d
    //  iters: %d agg iters: %d validation: %d graph: %d unalign: %d"
    // Ranks as threads of one process (`--threads`) are nccl-tests' `-t N`.
    let threads = if s.threads {
        s.ranks.unwrap_or(crate::launch::DEFAULT_RANKS)
    } else {
        1
    };
    out += &format!(
        "# nThread {threads} nGpus 1 minBytes {} maxBytes {} step: {step}({unit}) warmup iters: {} \
         iters: {} agg iters: 1 validation: {} graph: 0 unalign: 0\n",
        s.min_bytes, s.max_bytes, s.warmup, s.iters, s.check
    );
    if s.blocking {
        out += "# Blocking Enabled: wait for completion and barrier after each collective \n";
    }
    out += "#\n# Using devices\n";
    out
}

/// One device line: "#  Rank %2d Group %2d Pid %6d on %10s device %2d [%s] %s", the
/// bracket saying where the buffers are (`cpu`, `cuda`).
pub fn rank_line(r: &RankInfo, kind: &str) -> String {
    format!(
        "#  Rank {:>2} Group {:>2} Pid {:>6} on {:>10} device {:>2} [{kind}] {}\n",
        r.rank,
        0,
        r.pid,
        r.host,
        r.device,
        r.description()
    )
}

/// `#` and the three column-header lines.
pub fn columns() -> String {
    // "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          "
    let mut out = "#\n".to_owned();
    out += &format!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place                       \
         in-place          \n",
        "", "", "", "", ""
    );
    // "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s"
    let line = |f: [&str; 13]| {
        format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  \
             {:>6}  {:>6} \n",
            f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10], f[11], f[12]
        )
    };
    out += &line([
        "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
        "algbw", "busbw", "#wrong",
    ]);
    out += &line([
        "(B)",
        "(elements)",
        "",
        "",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
    ]);
    out
}

/// One row: "%12li  %12li  %8s  %6s  %6s", then per placement "  %7s  %6s  %6s  %6g" (or
/// `    N/A` for #wrong without a check), then a newline. A placement oxccl has no call for
/// reads N/A throughout.
pub fn row_line(row: &Row, oop: Option<&Measured>, ip: Option<&Measured>) -> String {
    let root = row.root.map_or(-1, |r| r as i64);
    let mut out = format!(
        "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}",
        row.size,
        row.count,
        row.dtype.name(),
        row.op.map_or("none", |o| o.name()),
        root
    );
    for m in [oop, ip] {
        out += &match m {
            Some(m) => {
                let wrong = match m.nwrong {
                    Some(w) => format!("  {:>6}", cfmt::g(w as f64)),
                    None => "    N/A".to_owned(),
                };
                format!(
                    "  {}  {}  {}{wrong}",
                    cfmt::fit(m.time_us, 7),
                    cfmt::fit(m.alg_bw, 6),
                    cfmt::fit(m.bus_bw, 6)
                )
            }
            None => format!("  {:>7}  {:>6}  {:>6}    N/A", "N/A", "N/A", "N/A"),
        };
    }
    out.push('\n');
    out
}

/// The footer: "# %-20s : %d %s", "# %-20s : %g ", "#", the closing line.
pub fn footer(coll_name: &str, out_of_bounds: u64, avg_bus_bw: f64) -> String {
    let verdict = if out_of_bounds == 0 { "OK" } else { "FAILED" };
    format!(
        "# {:<20} : {out_of_bounds} {verdict}\n# {:<20} : {} \n#\n# Collective test concluded: \
         {coll_name}_perf\n",
        "Out of bounds values",
        "Avg bus bandwidth",
        cfmt::g(avg_bus_bw)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coll::Coll;
    use oxccl::types::{DataType, ReduceOp};

    fn measured(t: f64, bw: f64, wrong: Option<u64>) -> Measured {
        Measured {
            time_us: t,
            alg_bw: bw,
            bus_bw: bw,
            nwrong: wrong,
            p50_us: t,
            p99_us: t,
            iterations: 20,
            repeats_us: vec![t],
        }
    }

    #[test]
    fn rows_and_headers_match_the_c_format_strings() {
        // Expected lines are what Python's %-formatting (C semantics) makes of nccl-tests'
        // format strings.
        let row = Row {
            coll: Coll::AllReduce,
            dtype: DataType::F32,
            op: Some(ReduceOp::Sum),
            root: None,
            size: 8,
            count: 2,
            algorithm: "direct".into(),
        };
        let a = measured(10.5, 0.0, Some(0));
        let b = measured(10.21, 0.0, Some(0));
        assert_eq!(
            row_line(&row, Some(&a), Some(&b)),
            "           8             2     float     sum      -1    10.50    0.00    0.00       0    10.21    0.00    0.00       0\n"
        );
        let c = measured(1234567.0, 123.456, None);
        assert_eq!(
            row_line(&row, Some(&c), None),
            "           8             2     float     sum      -1  1234567  123.46  123.46    N/A      N/A     N/A     N/A    N/A\n"
        );
        let cols = columns();
        let headers: Vec<&str> = cols.lines().collect();
        assert_eq!(headers[0], "#");
        assert_eq!(
            headers[1],
            "#                                                              out-of-place                       in-place          "
        );
        assert_eq!(
            headers[2],
            "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong "
        );
        assert_eq!(
            headers[3],
            "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)         "
        );
    }

    #[test]
    fn device_lines_and_footer_follow_nccl_tests() {
        let r = RankInfo {
            rank: 1,
            host: "host01".into(),
            pid: 12345,
            device: 1,
            transports: vec!["tcp".into()],
            algorithm: "auto".into(),
        };
        assert_eq!(
            rank_line(&r, "cpu"),
            "#  Rank  1 Group  0 Pid  12345 on     host01 device  1 [cpu] tcp; algorithm auto\n"
        );
        assert_eq!(RankInfo::decode(&r.encode()), Some(r));
        assert_eq!(
            footer("all_reduce", 0, 1.5),
            "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 1.5 \n#\n\
             # Collective test concluded: all_reduce_perf\n"
        );
        assert!(footer("reduce", 3, 0.0).starts_with("# Out of bounds values : 3 FAILED\n"));
    }
}
