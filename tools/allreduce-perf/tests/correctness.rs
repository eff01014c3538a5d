//! The check end to end: every collective on 3 ranks with several types and operators passes;
//! every type with every operator passes; a planted fault (one flipped element on one rank)
//! shows in #wrong, in the footer and in the exit status.

mod util;

use util::{perf, rows, run, stderr, stdout};

/// Runs `--op coll` on 3 ranks over a small sweep and asserts every row checked clean.
fn sweep_passes(coll: &str) {
    let o = run(&[
        "--ranks",
        "3",
        "--op",
        coll,
        "-b",
        "8",
        "-e",
        "64K",
        "-f",
        "8",
        "-n",
        "2",
        "-w",
        "1",
        "-d",
        "int8,uint8,int32,int64,half,bfloat16,float,double",
        "-o",
        "sum,prod,min,max,avg",
        "-r",
        "1",
    ]);
    let out = stdout(&o);
    assert!(
        o.status.success(),
        "{coll}: {:?}\n{out}\n{}",
        o.status,
        stderr(&o)
    );
    assert!(out.contains("# Out of bounds values : 0 OK"), "{out}");
    let rows = rows(&out);
    let per_type = if coll == "allreduce" || coll == "reducescatter" || coll == "reduce" {
        5
    } else {
        1
    };
    assert_eq!(rows.len(), 8 * per_type * 5, "{out}");
    for row in rows {
        let wrong: Vec<&str> = row
            .split_whitespace()
            .filter(|w| *w == "0" || *w == "N/A")
            .collect();
        assert!(
            wrong.len() >= 2,
            "{coll}: a row without clean #wrong columns: {row}"
        );
    }
}

#[test]
fn allreduce_on_three_ranks_checks_clean() {
    sweep_passes("allreduce");
}

#[test]
fn allgather_on_three_ranks_checks_clean() {
    sweep_passes("allgather");
}

#[test]
fn reducescatter_on_three_ranks_checks_clean() {
    sweep_passes("reducescatter");
}

#[test]
fn broadcast_on_three_ranks_checks_clean() {
    sweep_passes("broadcast");
}

#[test]
fn reduce_on_three_ranks_checks_clean() {
    sweep_passes("reduce");
}

#[test]
fn alltoall_on_three_ranks_checks_clean() {
    sweep_passes("alltoall");
}

#[test]
fn gather_on_three_ranks_checks_clean() {
    sweep_passes("gather");
}

#[test]
fn scatter_on_three_ranks_checks_clean() {
    sweep_passes("scatter");
}

#[test]
fn sendrecv_on_three_ranks_checks_clean() {
    sweep_passes("sendrecv");
}

#[test]
fn every_type_with_every_operator_checks_clean() {
    let o = run(&[
        "-b", "8", "-e", "512", "-f", "4", "-n", "1", "-w", "0", "-d", "all", "-o", "all",
    ]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}\n{}", stderr(&o));
    // 6 integer types × 8 operators + 6 float types × 5 operators, 4 sizes each.
    assert_eq!(rows(&out).len(), (6 * 8 + 6 * 5) * 4, "{out}");
    for op in ["band", "bor", "bxor", "avg", "prod"] {
        assert!(
            out.contains(&format!("   int8  {op:>6}")),
            "no int8 {op} row:\n{out}"
        );
    }
    assert!(
        !out.contains(" float    band"),
        "a bitwise operator ran on floats:\n{out}"
    );
    for op in ["sum", "avg", "prod", "min", "max"] {
        for t in ["f8e4m3", "f8e5m2"] {
            assert!(
                out.contains(&format!(" {t}  {op:>6}")),
                "no {t} {op} row:\n{out}"
            );
        }
    }
    assert!(
        !out.contains(" f8e4m3    band"),
        "a bitwise operator ran on fp8:\n{out}"
    );
}

#[test]
fn a_planted_fault_is_counted_and_fails_the_run() {
    let json = util::scratch("fault.json");
    let o = run(&[
        "-b",
        "8",
        "-e",
        "1K",
        "-f",
        "4",
        "-n",
        "1",
        "-w",
        "0",
        "--corrupt-rank",
        "1",
        "-J",
        json.to_str().unwrap(),
    ]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}\n{}", stderr(&o));
    let rows = rows(&out);
    assert_eq!(rows.len(), 4);
    for row in &rows {
        // One flipped element per checked call, on one rank: #wrong is 1 in both placements.
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!((cols[8], cols[12]), ("1", "1"), "{row}");
    }
    assert!(out.contains("# Out of bounds values : 8 FAILED"), "{out}");
    // Rank 1 finishing first must not cut rank 0 short of writing its files.
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(doc["out_of_bounds"], 8);
    assert_eq!(doc["rows"][0]["in_place"]["nwrong"], 1);
}

#[test]
fn a_fault_on_a_rank_without_output_changes_nothing() {
    // Reduce writes only the root's output: rank 1 has nothing to corrupt.
    let o = run(&[
        "--op",
        "reduce",
        "-b",
        "64",
        "-e",
        "64",
        "-n",
        "1",
        "--corrupt-rank",
        "1",
    ]);
    assert!(o.status.success(), "{}", stdout(&o));
    let o = run(&[
        "--op",
        "reduce",
        "-b",
        "64",
        "-e",
        "64",
        "-n",
        "1",
        "--corrupt-rank",
        "0",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
}

#[test]
fn unchecked_runs_print_na() {
    let o = run(&[
        "-b",
        "64",
        "-e",
        "64",
        "-n",
        "1",
        "-c",
        "0",
        "--corrupt-rank",
        "1",
    ]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}");
    let row = rows(&out)[0];
    assert!(row.ends_with("    N/A"), "{row}");
    assert_eq!(row.matches("N/A").count(), 2, "{row}");
    assert!(out.contains("validation: 0"), "{out}");
}

#[test]
fn the_direct_way_is_right_wherever_buffers_lie_within_a_page() {
    // The direct way places its scratch at the offset within a page of the peer memory it
    // copies with, and copies between users' buffers whose distance is slow for the kernel
    // through that scratch: buffers 0, 16 and 4088 bytes past a page, sizes whose per-rank
    // slices, blocks (8 to 48 bytes past a page multiple: slow distances among them) and
    // 128 KiB parts end mid-page. Broadcast's root in place writes into its peers; gather's
    // peers write into the root. "0,16,4088": each of the 3 ranks places its buffers
    // differently, so a sum written to two peers meets a slow distance at one of them.
    for offset in ["0", "16", "4088", "0,16,4088"] {
        for coll in [
            "allreduce",
            "reducescatter",
            "reduce",
            "allgather",
            "alltoall",
            "gather",
            "scatter",
            "broadcast",
        ] {
            let o = perf()
                .env("OXCCL_AREA_WAY", "direct")
                .args([
                    "--ranks",
                    "3",
                    "--op",
                    coll,
                    "--buffer-offset",
                    offset,
                    "-b",
                    "393240",
                    "-e",
                    "1179720",
                    "-f",
                    "3",
                    "-n",
                    "2",
                    "-w",
                    "1",
                    "-d",
                    "half,float,double",
                    "-o",
                    "sum,max",
                ])
                .output()
                .expect("allreduce-perf starts");
            let out = stdout(&o);
            assert!(
                o.status.success(),
                "{coll} at {offset}: {:?}\n{out}\n{}",
                o.status,
                stderr(&o)
            );
            assert!(
                out.contains("# Out of bounds values : 0 OK"),
                "{coll} at {offset}: {out}"
            );
            assert!(!rows(&out).is_empty(), "{coll} at {offset}: {out}");
        }
    }
}
