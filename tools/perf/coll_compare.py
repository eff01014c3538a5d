#!/usr/bin/env python3
"""Summarises a tools/perf/coll-vs-peers.sh run: per collective and size, the median over rounds
of each peer's time (coll.sh CSV: label,coll,bytes,count,iters,repeats,median_us,...) and of
oxccl's (allreduce-perf --csv, both placements), and oxccl's speed over the best peer's in the
peers' placement: out of place, except broadcast, whose MPI_Bcast root sends from its one buffer
and copies nothing (nccl-tests' in-place broadcast)."""
import csv, glob, os, statistics, sys

NAMES = {"allgather": "all_gather", "reducescatter": "reduce_scatter", "broadcast": "broadcast",
         "reduce": "reduce", "alltoall": "all_to_all", "allreduce": "all_reduce"}
# Collectives whose peer benchmark runs in place (peer-bench's MPI_Bcast: the root's one buffer).
IN_PLACE_PEERS = {"broadcast"}

def human(us):
    return f"{us:.2f} µs" if us < 1000 else f"{us / 1e3:.2f} ms"

def main(out, sizes):
    sizes = [int(s) for s in sizes.split()]
    times = {}  # (coll, label, bytes) -> [us per round]
    for path in glob.glob(os.path.join(out, "peer_r*_*.csv")):
        for row in csv.reader(open(path)):
            if len(row) < 7 or not row[2].isdigit():
                continue
            times.setdefault((row[1], row[0], int(row[2])), []).append(float(row[6]))
    for path in glob.glob(os.path.join(out, "oxccl_r*_*.csv")):
        coll = os.path.basename(path).split("_")[2]
        for row in csv.DictReader(open(path)):
            label = "oxccl" if row["placement"] == "out-of-place" else "oxccl in place"
            times.setdefault((coll, label, int(row["size"])), []).append(float(row["time_us"]))
            times.setdefault((coll, "route", int(row["size"])), [row["algorithm"]])
    for coll in sorted({c for c, _, _ in times}, key=lambda c: list(NAMES).index(c) if c in NAMES else 99):
        peers = sorted({l for c, l, _ in times if c == coll and not l.startswith("oxccl") and l != "route"})
        print(f"\n{coll}, float32, time per call (median over rounds):\n")
        placement = "in place" if coll in IN_PLACE_PEERS else "out of place"
        print("| size | " + " | ".join(peers) + " | oxccl | oxccl in place | route | "
              f"oxccl / best peer ({placement}) |")
        print("|---|" + "---|" * (len(peers) + 4))
        for s in sizes:
            cells, best = [], None
            for l in peers:
                t = times.get((coll, l, s))
                if t:
                    m = statistics.median(t)
                    best = m if best is None else min(best, m)
                    cells.append(human(m))
                else:
                    cells.append("—")
            ours = times.get((coll, "oxccl", s))
            ip = times.get((coll, "oxccl in place", s))
            route = times.get((coll, "route", s), ["—"])[0]
            o = statistics.median(ours) if ours else None
            compared = ip if coll in IN_PLACE_PEERS else ours
            c = statistics.median(compared) if compared else None
            ratio = f"{best / c:.2f}×" if c and best else "—"
            print(f"| {s} | " + " | ".join(cells) + f" | {human(o) if o else '—'} | "
                  f"{human(statistics.median(ip)) if ip else '—'} | {route} | {ratio} |")
        # The phase each run began in (coll-vs-peers.sh's phase.csv): near and far phases of
        # the machine differ by 4x in a cache line's round trip.
        phases = os.path.join(out, "phase.csv")
        if os.path.exists(phases):
            seen = {}
            for r, c, who, size, before, after in csv.reader(open(phases)):
                if c == coll:
                    at = "" if who == "peers" else " " + size
                    seen.setdefault(who, []).append(f"r{r}{at}: {before}/{after}")
            print("\ncross-core round trip before/after each run, ns: " + "; ".join(
                f"{who} {', '.join(v)}" for who, v in sorted(seen.items())))

if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
