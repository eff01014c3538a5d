#!/usr/bin/env python3
"""Convert peer-bench CSV output into allreduce-perf's JSON schema, for `--overlay`.

peer-bench (../../../shared/tools/peer-bench/src/mpi_allreduce_bench.c) prints comment lines
starting with '#', a header, then one line per size:

    label,bytes,count,iters,repeats,median_us,min_us,max_us,algbw_GBps,busbw_GBps[,WRONG_RESULT]

Its protocol is a float32 sum all-reduce, out of place, so every row becomes an all_reduce row
with an out-of-place placement and no in-place one. Its time is the median over repeats of
the per-call mean (ranks combined by their maximum, like `allreduce-perf -a 3`); p50 and p99 of
single iterations are not measured and are written as null.

Usage: peer2json.py INPUT.csv [-o OUTPUT.json] [--label NAME]
A file holding several labels needs --label to pick one. Standard library only.
"""

import argparse
import csv
import json
import re
import sys

FIELDS = ["label", "bytes", "count", "iters", "repeats", "median_us", "min_us", "max_us",
          "algbw_GBps", "busbw_GBps"]


def convert(lines, label=None, source="peer-bench"):
    """Returns the JSON document for the rows of `label` (the only one when None)."""
    comments = [l.strip() for l in lines if l.startswith("#")]
    body = [l for l in lines if l.strip() and not l.startswith("#")]
    if not body:
        raise ValueError("no CSV lines")
    reader = csv.reader(body)
    header = next(reader)
    if header[:len(FIELDS)] != FIELDS:
        raise ValueError("unexpected header %r (want %s)" % (",".join(header), ",".join(FIELDS)))
    records = [r for r in reader if r]
    labels = sorted({r[0] for r in records})
    if label is None:
        if len(labels) != 1:
            raise ValueError("the file holds labels %s: pick one with --label" % ", ".join(labels))
        label = labels[0]
    elif label not in labels:
        raise ValueError("label %r not in the file (it holds %s)" % (label, ", ".join(labels)))

    nranks = None
    for c in comments:
        m = re.search(r"nranks=(\d+)", c)
        if m:
            nranks = int(m.group(1))
    library = next((c[len("# library:"):].strip() for c in comments
                    if c.startswith("# library:")), None)

    rows = []
    wrong = 0
    for r in records:
        if r[0] != label:
            continue
        if len(r) < len(FIELDS):
            raise ValueError("short line: %s" % ",".join(r))
        bad = len(r) > len(FIELDS) and r[len(FIELDS)] == "WRONG_RESULT"
        wrong += 1 if bad else 0
        rows.append({
            "collective": "all_reduce",
            "size": int(r[1]),
            "count": int(r[2]),
            "type": "float",
            "redop": "sum",
            "root": -1,
            "algorithm": None,
            "out_of_place": {
                "time_us": float(r[5]),
                "alg_bw": float(r[8]),
                "bus_bw": float(r[9]),
                # peer-bench flags a wrong row but does not count elements.
                "nwrong": 1 if bad else 0,
                "p50_us": None,
                "p99_us": None,
                "iterations": int(r[3]),
            },
            "in_place": None,
        })
    bws = [row["out_of_place"]["bus_bw"] for row in rows]
    return {
        "tool": source,
        "version": library,
        "oxccl_version": None,
        "label": label,
        "host": None,
        "args": [],
        "start_time": None,
        "end_time": None,
        "config": {
            "collective": "all_reduce",
            "nranks": nranks or 0,
            "launch": "mpirun",
            "datatypes": ["float"],
            "ops": ["sum"],
            "repeats": int(records[0][4]) if records else 0,
            "average": "max",
            "device": "cpu",
        },
        "ranks": [],
        "rows": rows,
        "avg_bus_bw": sum(bws) / len(bws) if bws else 0.0,
        "out_of_bounds": wrong,
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("input", help="peer-bench CSV file ('-' for stdin)")
    p.add_argument("-o", "--output", help="JSON file to write (default: stdout)")
    p.add_argument("--label", help="which label to convert when the file holds several")
    args = p.parse_args(argv)
    try:
        if args.input == "-":
            lines = sys.stdin.read().splitlines()
        else:
            with open(args.input, encoding="utf-8") as f:
                lines = f.read().splitlines()
        doc = convert(lines, args.label)
    except (OSError, ValueError) as e:
        print("peer2json: %s: %s" % (args.input, e), file=sys.stderr)
        return 1
    text = json.dumps(doc, indent=2) + "\n"
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
