//! The table's layout: a real run, masked, against tests/golden/all_reduce.txt (regenerate with
//! UPDATE_GOLDEN=1 after a deliberate change), and the mask itself, which must reject a table
//! whose columns are off.

mod util;

use std::path::PathBuf;

use util::{mask, run, stdout};

const GOLDEN_ARGS: &[&str] = &[
    "-b",
    "8",
    "-e",
    "1K",
    "-f",
    "4",
    "-n",
    "2",
    "-w",
    "1",
    "-d",
    "float,half",
    "-o",
    "sum,max",
];

fn golden_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/all_reduce.txt")
}

#[test]
fn the_table_matches_the_golden_file() {
    let o = run(GOLDEN_ARGS);
    assert!(o.status.success(), "{o:?}");
    let masked = mask(&stdout(&o)).unwrap_or_else(|e| panic!("{e}\n{}", stdout(&o)));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(golden_path(), &masked).unwrap();
    }
    let golden = std::fs::read_to_string(golden_path()).expect("the golden file exists");
    assert_eq!(
        masked,
        golden,
        "the table's layout changed:\n{}",
        stdout(&o)
    );
}

const SAMPLE: &str = "\
# oxccl allreduce-perf version 1.2.3 (nccl-tests layout)
#  Rank  0 Group  0 Pid  12345 on     host01 device  0 [cpu] tcp; algorithm auto
#  Rank  1 Group  0 Pid 1234567 on a-very-long-host device  1 [cpu] shm,tcp; algorithm ring
           8             2     float     sum      -1    10.50    0.00    0.00       0    10.21    0.00    0.00       0
        1024           256     float     sum      -1  1234567  123.46  123.46    N/A      N/A     N/A     N/A    N/A
# Avg bus bandwidth    : 0.123 
";

#[test]
fn the_mask_hides_what_varies_and_keeps_the_rest() {
    let m = mask(SAMPLE).unwrap();
    let lines: Vec<&str> = m.lines().collect();
    assert_eq!(
        lines[0],
        "# oxccl allreduce-perf version <version> (nccl-tests layout)"
    );
    assert_eq!(
        lines[1],
        "#  Rank  0 Group  0 Pid PPPPPP on <host> device  0 [cpu] <transports>; algorithm auto"
    );
    assert_eq!(
        lines[2],
        "#  Rank  1 Group  0 Pid PPPPPP on <host> device  1 [cpu] <transports>; algorithm ring"
    );
    assert_eq!(
        lines[3],
        "           8             2     float     sum      -1  xxxxxxx  xxxxxx  xxxxxx       0  xxxxxxx  xxxxxx  xxxxxx       0"
    );
    assert_eq!(
        lines[4],
        "        1024           256     float     sum      -1  xxxxxxx  xxxxxx  xxxxxx    N/A      N/A     N/A     N/A    N/A"
    );
    assert_eq!(lines[5], "# Avg bus bandwidth    : <bw> ");
}

#[test]
fn the_mask_rejects_broken_layouts() {
    let good = "           8             2     float     sum      -1    10.50    0.00    0.00       0    10.21    0.00    0.00       0";
    assert!(mask(good).is_ok());
    for bad in [
        // a column one character narrower
        "          8             2     float     sum      -1    10.50    0.00    0.00       0    10.21    0.00    0.00       0",
        // a value too wide for its column
        "           8             2     float     sum      -1  10.50000    0.00    0.00       0    10.21    0.00    0.00       0",
        // a single space between columns
        "           8             2     float     sum      -1    10.50    0.00    0.00       0    10.21    0.00   0.00        0",
        // a missing placement
        "           8             2     float     sum      -1    10.50    0.00    0.00       0",
        // trailing text
        "           8             2     float     sum      -1    10.50    0.00    0.00       0    10.21    0.00    0.00       0 x",
        // not a number
        "           8             2     float     sum      -1    10.50    fast    0.00       0    10.21    0.00    0.00       0",
        // a device line without the pid field
        "#  Rank  0 Group  0 on     host01 device  0 [cpu] tcp; algorithm auto",
        "# Avg bus bandwidth    : 0.123",
    ] {
        assert!(mask(bad).is_err(), "accepted {bad:?}");
    }
}
