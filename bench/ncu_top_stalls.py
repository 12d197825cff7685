"""The instructions where a kernel's warps were sampled most, from Nsight Compute's source page exported as CSV
(`ncu -i REPORT --page source --csv --print-source sass > FILE`): which loads, waits or conversions the time
goes to. Tolerant of the column names, which vary between ncu versions.

    python bench/ncu_top_stalls.py FILE [--top 30]
"""
from __future__ import annotations

import argparse
import csv


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    with open(args.csv, newline="") as f:
        lines = [line for line in f if line.strip() and not line.startswith("==")]
    # Newer ncu versions put a "Kernel Name" line above the header: start at the header.
    start = next((i for i, line in enumerate(lines) if line.startswith('"Address"')), 0)
    lines = lines[start:]
    rows = list(csv.DictReader(lines))
    if not rows:
        raise SystemExit("no rows in the CSV")
    cols = list(rows[0].keys())
    samples = [c for c in cols if "Sampling" in c and "Not" not in c] or [c for c in cols if "Sampl" in c]
    source = next((c for c in cols if c.lower() in ("source", "sass")), cols[1] if len(cols) > 1 else cols[0])
    if not samples:
        raise SystemExit(f"no sampling column among {cols}")
    key = samples[0]
    total = sum(number(r[key]) for r in rows) or 1.0
    print(f"columns: {cols}\nsorted by {key!r} (total {total:.0f} samples)")
    for r in sorted(rows, key=lambda r: -number(r[key]))[: args.top]:
        reasons = sorted(((number(r[c]), c[6:]) for c in cols if c.startswith("stall_") and "Not Issued" not in c), reverse=True)
        extra = " ".join(f"{name}={int(n)}" for n, name in reasons[:3] if n > 0)
        print(f"{100 * number(r[key]) / total:5.1f}%  {r.get('Address', ''):>8}  {r[source][:90]:<90}  {extra}")


if __name__ == "__main__":
    main()
