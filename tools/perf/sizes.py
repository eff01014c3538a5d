#!/usr/bin/env python3
"""The sizes of an allreduce-perf sweep, one per line: from 8 bytes by FACTOR up to MAX (a
count of bytes, or with K, M or G as allreduce-perf takes it: 64M). For scripts that run each
size on its own (tuner-check.sh, sim-hosts.sh).

usage: sizes.py MAX FACTOR"""
import sys


def parse(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(text[:-1]) * units[text[-1]] if text[-1:] in units else int(text)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    top, factor = parse(sys.argv[1]), int(sys.argv[2])
    if factor < 2:
        sys.exit("sizes.py: FACTOR must be at least 2")
    size = 8
    while size <= top:
        print(size)
        size *= factor
