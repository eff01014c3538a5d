#!/usr/bin/env python3
"""In place against out of place from one allreduce-perf JSON file (`-J`).

Usage: tools/perf/placement.py RUN.json

Prints a markdown table per row: the route, each placement's time (the median of the -R
repeats, allreduce-perf's time column), in-place speed / out-of-place speed from those, from
the fastest repeats (best_us), and paired: the median over k of out-of-place repeat k's time
over in-place repeat k's (the two ran back to back: allreduce-perf alternates them, and since
2026-11-28 turns which of a pair runs first), and in how
many pairs in place was the faster. Where the machine's speed swings between two states from
one repeat to the next, the two medians can fall in different states; the fastest repeats and
the pairs compare the placements in the same one. Exit status 1 when the file has no row
measured in both placements.
"""
import json
import statistics
import sys


def human(size):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= div and size % div == 0:
            return f"{size // div} {unit}"
    return f"{size} B"


def us(t):
    return f"{t / 1000:.2f} ms" if t >= 1000 else f"{t:.2f} µs"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[2])
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    print("| size | route | out of place | in place | speed ratio (medians) | "
          "fastest: out of place | in place | speed ratio (fastest) | "
          "speed ratio (pairs, median) | in place faster |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    worst = None
    for r in doc.get("rows", []):
        o, i = r.get("out_of_place"), r.get("in_place")
        if not o or not i or not o.get("time_us") or not i.get("time_us"):
            continue
        ratio = o["time_us"] / i["time_us"]
        ob, ib = o.get("best_us"), i.get("best_us")
        best = f"{us(ob)} | {us(ib)} | {ob / ib:.3f}" if ob and ib else "— | — | —"
        pairs = [(a, b) for a, b in zip(o.get("repeats_us", []), i.get("repeats_us", []))
                 if a > 0 and b > 0]
        if pairs:
            paired = (f"{statistics.median(a / b for a, b in pairs):.3f} | "
                      f"{sum(b < a for a, b in pairs)} of {len(pairs)}")
        else:
            paired = "— | —"
        print(f"| {human(r['size'])} | {r.get('algorithm', '')} | {us(o['time_us'])} | "
              f"{us(i['time_us'])} | {ratio:.3f} | {best} | {paired} |")
        worst = ratio if worst is None else min(worst, ratio)
    if worst is None:
        sys.exit("no row measured in both placements")


if __name__ == "__main__":
    main()
