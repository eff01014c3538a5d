//! Shared by the integration tests: running the binary, scratch paths, and the mask that hides
//! what varies between runs (times, bandwidths, pids, host names, versions, transports) while
//! checking the table's layout column by column.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The benchmark binary, with a short deadline so a hang fails the test instead of waiting.
pub fn perf() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_allreduce-perf"));
    for var in [
        "OXCCL_RANK",
        "OXCCL_WORLD_SIZE",
        "OXCCL_STORE",
        "RANK",
        "PMI_RANK",
        "SLURM_PROCID",
    ] {
        c.env_remove(var);
    }
    c.env("OXCCL_TIMEOUT", "60");
    c
}

/// Runs the binary with `args` (standalone: it starts its own ranks).
pub fn run(args: &[&str]) -> Output {
    perf().args(args).output().expect("allreduce-perf starts")
}

/// stdout as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// stderr as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A fresh path in the test scratch directory.
pub fn scratch(name: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::SeqCst);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("allreduce-perf-tests");
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir.join(format!("{}-{n}-{name}", std::process::id()))
}

/// The data rows of a table (lines not starting with `#`).
pub fn rows(table: &str) -> Vec<&str> {
    table.lines().filter(|l| !l.starts_with('#')).collect()
}

/// Width of the size, count, type, redop and root columns with their separators:
/// "%12li  %12li  %8s  %6s  %6s".
const ROW_HEAD: usize = 12 + 2 + 12 + 2 + 8 + 2 + 6 + 2 + 6;

/// Masks `table` for comparison with a golden file, failing on any line whose layout is off.
///
/// Kept verbatim: every header line but the version, the size, count, type, redop, root and
/// #wrong columns, the out-of-bounds line. Masked: the version, each device line's pid, host and
/// transports, each time, algbw and busbw (to `x` over the column's width, after checking the
/// value is a number right-aligned in exactly that width), the average bus bandwidth.
pub fn mask(table: &str) -> Result<String, String> {
    let mut out = String::new();
    for (i, line) in table.lines().enumerate() {
        let bad = |why: &str| format!("line {}: {why}: {line:?}", i + 1);
        let masked = if let Some(rest) = line.strip_prefix("# oxccl allreduce-perf version ") {
            let (_, tail) = rest
                .split_once(' ')
                .ok_or_else(|| bad("no text after the version"))?;
            format!("# oxccl allreduce-perf version <version> {tail}")
        } else if line.starts_with("#  Rank ") {
            mask_device_line(line).map_err(|e| bad(&e))?
        } else if let Some(bw) = line.strip_prefix("# Avg bus bandwidth    : ") {
            let v = bw
                .strip_suffix(' ')
                .ok_or_else(|| bad("no trailing space"))?;
            v.parse::<f64>().map_err(|_| bad("not a number"))?;
            "# Avg bus bandwidth    : <bw> ".to_owned()
        } else if line.starts_with('#') {
            line.to_owned()
        } else {
            mask_row(line).map_err(|e| bad(&e))?
        };
        out.push_str(&masked);
        out.push('\n');
    }
    Ok(out)
}

/// "#  Rank %2d Group %2d Pid %6d on %10s device %2d [cpu] TRANSPORTS; algorithm NAME".
fn mask_device_line(line: &str) -> Result<String, String> {
    let (head, rest) = line.split_at_checked(20).ok_or("too short")?;
    // head = "#  Rank %2d Group %2d " — rank and group are deterministic.
    if !head.starts_with("#  Rank ") || &head[10..17] != " Group " || !head.ends_with(' ') {
        return Err("rank/group fields misplaced".into());
    }
    let rest = rest.strip_prefix("Pid ").ok_or("no Pid")?;
    let (pid, rest) = rest.split_once(" on ").ok_or("no host")?;
    if pid.len() < 6 || pid.trim_start().parse::<u32>().is_err() {
        return Err(format!("pid {pid:?} is not a number in a %6d field"));
    }
    let (host, rest) = rest.split_once(" device ").ok_or("no device")?;
    if host.len() < 10 || host.trim().is_empty() || host.trim().contains(' ') {
        return Err(format!("host {host:?} is not a name in a %10s field"));
    }
    let (device, rest) = rest.split_once(" [cpu] ").ok_or("no [cpu]")?;
    if device.len() != 2 || device.trim().parse::<u32>().is_err() {
        return Err(format!("device {device:?} is not a %2d field"));
    }
    let (transports, algo) = rest.split_once("; algorithm ").ok_or("no algorithm")?;
    if transports.is_empty() || transports.contains(' ') {
        return Err(format!("transports {transports:?}"));
    }
    // The routes that run follow the transports (`auto (shm one-shot)`): masked with them.
    let algo = match algo.split_once(" (") {
        Some((a, routes)) if routes.ends_with(')') => format!("{a} (<routes>)"),
        _ => algo.to_owned(),
    };
    Ok(format!(
        "{head}Pid PPPPPP on <host> device {device} [cpu] <transports>; algorithm {algo}"
    ))
}

/// One data row: the deterministic head verbatim, then per placement "  %7s  %6s  %6s" with
/// each value masked, and "  %6g" or "    N/A" verbatim.
fn mask_row(line: &str) -> Result<String, String> {
    let (head, mut rest) = line
        .split_at_checked(ROW_HEAD)
        .ok_or("shorter than the row head")?;
    check_fields(head, &[12, 12, 8, 6, 6])?;
    let mut out = head.to_owned();
    for placement in ["out-of-place", "in-place"] {
        for width in [7, 6, 6] {
            let (field, tail) = rest
                .split_at_checked(2 + width)
                .ok_or(format!("{placement}: too short"))?;
            let value = field
                .strip_prefix("  ")
                .ok_or(format!("{placement}: no separator"))?;
            let v = value.trim_start();
            if v.len() == value.len() && value.len() > width {
                return Err(format!("{placement}: {value:?} overflows its column"));
            }
            if v == "N/A" {
                out += &format!("  {value}");
            } else if v.parse::<f64>().is_ok() && value.len() == width {
                out += &format!("  {}", "x".repeat(width));
            } else {
                return Err(format!(
                    "{placement}: {value:?} is not a number in a {width}-wide column"
                ));
            }
            rest = tail;
        }
        let (wrong, tail) = rest
            .split_at_checked(if rest.starts_with("    N/A") { 7 } else { 8 })
            .ok_or(format!("{placement}: no #wrong"))?;
        if wrong != "    N/A" && (!wrong.starts_with("  ") || wrong.trim().parse::<f64>().is_err())
        {
            return Err(format!("{placement}: #wrong {wrong:?}"));
        }
        out += wrong;
        rest = tail;
    }
    if !rest.is_empty() {
        return Err(format!("trailing text {rest:?}"));
    }
    Ok(out)
}

/// Checks that `s` is right-aligned fields of these widths separated by two spaces.
fn check_fields(s: &str, widths: &[usize]) -> Result<(), String> {
    let mut at = 0;
    for (k, &w) in widths.iter().enumerate() {
        if k > 0 {
            if s.get(at..at + 2) != Some("  ") {
                return Err(format!("no two-space separator before column {}", k + 1));
            }
            at += 2;
        }
        let field = s.get(at..at + w).ok_or("row head too short")?;
        if field.trim().is_empty() || field.trim_start().contains(' ') {
            return Err(format!(
                "column {} {field:?} is not right-aligned in {w}",
                k + 1
            ));
        }
        at += w;
    }
    Ok(())
}
