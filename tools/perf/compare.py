#!/usr/bin/env python3
"""Summarises a tools/perf/vs-peers.sh run: per size, the median over rounds of each peer's
time (peer-bench CSVs: label,bytes,count,iters,repeats,median_us,...) and of oxccl's
(allreduce-perf JSON, out-of-place, and in place beside it), bus bandwidth, and oxccl's ratio to
the best peer (the peers run out of place; the in-place ratio compares oxccl in place with
them, which is what torch.distributed and most frameworks call)."""
import csv, glob, json, os, statistics, sys

def human(us):
    if us < 1000:
        return f"{us:.2f} us"
    if us < 1e6:
        return f"{us / 1e3:.2f} ms"
    return f"{us / 1e6:.2f} s"

def main(out):
    times = {}  # (label, bytes) -> [us per round]
    nranks = 2
    for path in sorted(glob.glob(os.path.join(out, "peer_r*", "*.csv"))):
        for row in csv.reader(open(path)):
            if len(row) < 10 or not row[1].isdigit():
                continue
            label, size, median = row[0], int(row[1]), float(row[5])
            if label in ("memcpy", "tcp", "shm") or "_" in label and label.split("_")[0] in ("shm", "tcp"):
                continue
            times.setdefault((label, size), []).append(median)
    for path in sorted(glob.glob(os.path.join(out, "oxccl_r*.json"))):
        doc = json.load(open(path))
        nranks = doc.get("config", {}).get("nranks", nranks)
        for row in doc["rows"]:
            times.setdefault(("oxccl", row["size"]), []).append(row["out_of_place"]["time_us"])
            if row.get("in_place"):
                times.setdefault(("oxccl in place", row["size"]), []).append(
                    row["in_place"]["time_us"])
    ours_labels = [l for l in ("oxccl", "oxccl in place") if any(k[0] == l for k in times)]
    labels = sorted({l for l, _ in times if l not in ours_labels}) + ours_labels
    sizes = sorted({s for _, s in times})
    factor = 2 * (nranks - 1) / nranks
    print(f"All-reduce, float32 sum, {nranks} ranks (peers out of place); median over rounds "
          f"of each run's median; in brackets bus bandwidth GB/s.\n")
    ratios = [f"{l} speed / best peer" for l in ours_labels]
    print("| size | " + " | ".join(labels + ratios) + " |")
    print("|---|" + "---|" * (len(labels) + len(ratios)))
    for s in sizes:
        cells, best = [], None
        for l in labels:
            t = times.get((l, s))
            if not t:
                cells.append("—")
                continue
            m = statistics.median(t)
            bw = s / (m * 1e-6) / 1e9 * factor
            cells.append(f"{human(m)} ({bw:.2f})" if s >= 65536 else human(m))
            if l not in ours_labels and (best is None or m < best):
                best = m
        for l in ours_labels:
            ours = times.get((l, s))
            cells.append(f"{best / statistics.median(ours):.2f}×" if best and ours else "—")
        print(f"| {s} B | " + " | ".join(cells) + " |")

if __name__ == "__main__":
    main(sys.argv[1])
