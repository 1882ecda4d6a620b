#!/usr/bin/env python3
"""Print one column of a bench/results CSV as a text chart, oldest first.

Usage: python3 bench/results/plot.py FILE COLUMN [FILTER=VALUE ...]
e.g.   python3 bench/results/plot.py bench/results/bootstorm.csv ramdisk_ratio
       python3 bench/results/plot.py bench/results/scale.csv ready_s servers=10000 engine=bbolt
Needs only Python's standard library.
"""
import csv
import sys


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    path, col = argv[1], argv[2]
    filters = dict(a.split("=", 1) for a in argv[3:])
    with open(path, newline="") as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    if rows and col not in rows[0]:
        print(f"{path}: no column {col!r}; columns: {', '.join(rows[0])}", file=sys.stderr)
        return 2
    pts = []
    for r in rows:
        if any(r.get(k) != v for k, v in filters.items()) or not r[col]:
            continue
        pts.append((f"{r['date']} {r.get('commit', '-')} run {r.get('run', r.get('servers', ''))}", float(r[col])))
    if not pts:
        print("no rows match", file=sys.stderr)
        return 1
    top = max(v for _, v in pts) or 1.0
    for label, v in pts:
        print(f"{label:34} {v:9.2f} {'#' * round(40 * v / top)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
