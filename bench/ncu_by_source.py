"""Where a kernel's warp samples fall by CUDA source line, from Nsight Compute's source page exported with both
sources (`ncu -i REPORT --page source --csv --print-source cuda,sass | gzip > FILE.csv.gz`, what
`PROFILE_SRC=1 scripts/gpu_job.sh stalls` returns). The build has -lineinfo, so each source line's row carries the
samples of the SASS instructions generated from it (inlined helpers count at their own line).

    python bench/ncu_by_source.py FILE.csv[.gz] [--top 25] [--regions gdn/kernels.cuh 985-1096:setup 1097-1135:prologue ...]

--regions SOURCE RANGE:NAME ...: also the samples summed over line ranges of one source file (regions of a kernel,
at the commit the profile was taken from); that file's other lines and every other file are listed as well, so
the shares add up to 100%. The stall reasons' shares of all samples (the export's stall_* columns) come after the
lines.
"""
from __future__ import annotations

import argparse
import csv
import gzip


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--regions", nargs="+", default=None, metavar="SOURCE RANGE:NAME")
    args = parser.parse_args()
    opener = gzip.open if args.csv.endswith(".gz") else open
    rows, path, samples_col, reason_cols, reasons = [], "?", None, {}, {}
    with opener(args.csv, "rt", newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "File Path":  # one section per source file
                path = row[1].split("/csrc/")[-1]
                continue
            if row[0] == "Line No":
                samples_col = row.index("Warp Stall Sampling (All Samples)")
                reason_cols = {i: h for i, h in enumerate(row) if h.startswith("stall_") and "Not Issued" not in h}
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
            for i, name in reason_cols.items():
                if i < len(row) and row[i]:
                    reasons[name] = reasons.get(name, 0) + float(row[i].replace(",", ""))
    total = sum(r[0] for r in rows)
    if not total:
        raise SystemExit(f"{args.csv}: no samples by source line (was it exported with --print-source cuda,sass?)")
    rows.sort(reverse=True)
    print(f"warp samples: {total}")
    for samples, where, source in rows[: args.top]:
        print(f"{100 * samples / total:5.1f}%  {where:36s} {source[:100]}")
    if reasons:  # each sample has one reason: the shares of all samples
        print("stall reasons: " + ", ".join(f"{name[6:]} {100 * n / total:.1f}%"
                                            for name, n in sorted(reasons.items(), key=lambda kv: -kv[1])[:8]))
    if args.regions:
        print_regions(rows, total, args.regions[0], args.regions[1:])


def print_regions(rows, total, source, specs):
    ranges = []
    for spec in specs:
        span, name = spec.split(":", 1)
        first, last = (int(x) for x in span.split("-"))
        ranges.append((first, last, name))
    sums = {}
    for samples, where, _ in rows:
        path, line = where.rsplit(":", 1)
        key = f"other file: {path}"
        if path == source:
            key = next((f"{name} ({first}-{last})" for first, last, name in ranges if first <= int(line) <= last),
                       f"other lines of {source}")
        sums[key] = sums.get(key, 0) + samples
    print(f"\nby region of {source}:")
    for key, samples in sorted(sums.items(), key=lambda kv: -kv[1]):
        print(f"{100 * samples / total:5.1f}%  {key}")


if __name__ == "__main__":
    main()
