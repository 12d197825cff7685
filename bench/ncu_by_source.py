"""Where a kernel's warp samples fall by CUDA source line, from Nsight Compute's source page exported with both
sources (`ncu -i REPORT --page source --csv --print-source cuda,sass | gzip > FILE.csv.gz`, what
`PROFILE_SRC=1 scripts/gpu_job.sh stalls` returns). The build has -lineinfo, so each source line's row carries the
samples of the SASS instructions generated from it (inlined helpers count at their own line).

    python bench/ncu_by_source.py FILE.csv[.gz] [--top 25]
"""
from __future__ import annotations

import argparse
import csv
import gzip


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    opener = gzip.open if args.csv.endswith(".gz") else open
    rows, path, samples_col = [], "?", None
    with opener(args.csv, "rt", newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "File Path":  # one section per source file
                path = row[1].split("/csrc/")[-1]
                continue
            if row[0] == "Line No":
                samples_col = row.index("Warp Stall Sampling (All Samples)")
                continue
            # a source line's row has its line number; its SASS rows follow with an empty first column
            if samples_col is None or not row[0] or len(row) <= samples_col:
                continue
            try:
                samples = int(float(row[samples_col].replace(",", "")))
            except ValueError:
                continue
            if samples:
                rows.append((samples, f"{path}:{row[0]}", row[1].strip()))
    total = sum(r[0] for r in rows)
    if not total:
        raise SystemExit(f"{args.csv}: no samples by source line (was it exported with --print-source cuda,sass?)")
    rows.sort(reverse=True)
    print(f"warp samples: {total}")
    for samples, where, source in rows[: args.top]:
        print(f"{100 * samples / total:5.1f}%  {where:36s} {source[:100]}")


if __name__ == "__main__":
    main()
