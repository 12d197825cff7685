"""The instructions where a kernel's warps were sampled most, from Nsight Compute's source page exported as CSV
(`ncu -i REPORT --page source --csv --print-source sass > FILE`): which loads, waits or conversions the time
goes to. Tolerant of the column names, which vary between ncu versions.

    python bench/ncu_top_stalls.py FILE [--top 30] [--blocks 20]

It also prints the kernel's stall reasons, its warp instructions executed, and its basic blocks (runs of
instructions executed equally often) ranked by samples with their share of the instructions.
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
    parser.add_argument("--blocks", type=int, default=20, help="basic blocks to list")
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
    executed = "Instructions Executed" if "Instructions Executed" in cols else None
    # The kernel as a whole: samples per stall reason, and warp instructions executed.
    reasons = {}
    for r in rows:
        for c in cols:
            if c.startswith("stall_") and "Not Issued" not in c:
                reasons[c[6:]] = reasons.get(c[6:], 0.0) + number(r[c])
    all_reasons = sum(reasons.values()) or 1.0
    print("stall reasons: " + ", ".join(f"{k} {100 * v / all_reasons:.1f}%" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])[:8]))
    if executed:
        total_exec = sum(number(r[executed]) for r in rows) or 1.0
        print(f"warp instructions executed: {total_exec:.3g}")
        # Basic blocks (runs of consecutive instructions executed equally often), by their samples: where the
        # time goes, how many instructions each block costs, and what they are.
        blocks, current = [], None
        for i, r in enumerate(rows):
            e = number(r[executed])
            if current is not None and e == current["exec"]:
                current["rows"].append(r)
            else:
                current = {"first": i, "exec": e, "rows": [r]}
                blocks.append(current)
        print(f"basic blocks by samples (top {args.blocks}): first line, times executed, length, % of instructions, % of samples, opcodes")
        for blk in sorted(blocks, key=lambda b: -sum(number(r[key]) for r in b["rows"]))[: args.blocks]:
            ops = {}
            for r in blk["rows"]:
                words = [w for w in r[source].split() if not w.startswith("@")]
                if words:
                    ops[words[0]] = ops.get(words[0], 0) + 1
            top_ops = ", ".join(f"{k} {v}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:6])
            share = 100 * blk["exec"] * len(blk["rows"]) / total_exec
            smp = 100 * sum(number(r[key]) for r in blk["rows"]) / total
            print(f"  line {blk['first']:5d}  x{blk['exec']:<9.3g} len {len(blk['rows']):4d}  instr {share:5.1f}%  samples {smp:5.1f}%  {top_ops}")
    print(f"columns: {cols}\ninstructions sorted by {key!r} (total {total:.0f} samples)")
    for r in sorted(rows, key=lambda r: -number(r[key]))[: args.top]:
        reasons = sorted(((number(r[c]), c[6:]) for c in cols if c.startswith("stall_") and "Not Issued" not in c), reverse=True)
        extra = " ".join(f"{name}={int(n)}" for n, name in reasons[:3] if n > 0)
        print(f"{100 * number(r[key]) / total:5.1f}%  {r.get('Address', ''):>8}  {r[source][:90]:<90}  {extra}")


if __name__ == "__main__":
    main()
