"""Tune entries that beat their default: the leads a `--tune` run holds beyond its headline numbers.

Reads benchmark JSONs (bench_mamba2.py, bench_gdn.py, bench_speculative.py, bench_gdn_speculative.py with --tune) and
prints, per row (batch, and T / accept rate / ring length where present) and kernel kind, every tune entry faster than
that kind's default by more than --min percent and by more than twice the larger of the two entries' spread between
rounds. Entries that change the launch mode rather than the kernel (`pdl=...`, opt-in) or the benchmark
(`cursors_aligned`) are left out unless --all. Session 37 found 8-50% at batches 3-16 in entries that sessions 36-37
had recorded and nobody had read (bench/NOTES.md); gpu_job.sh's variants step prints this after each benchmark.

    python3 bench/tune_leads.py bench/results/session37/*.json [--min 3] [--all]
"""
import argparse
import json
import os
import sys

SKIP = ("pdl=", "cursors_aligned")


def row_label(row):
    parts = [f"batch {row['batch']}"]
    for key, name in (("T", "T"), ("rate", "accept"), ("ring_len", "L")):
        if key in row:
            parts.append(f"{name} {row[key]}")
    return ", ".join(parts)


def leads(doc, min_percent=3.0, include_all=False):
    """(row label, kind, entry, default us, entry us, percent) for each entry that beats its default."""
    out = []
    for row in doc.get("rows", []):
        spread = row.get("round_spread", {})
        for key, entries in row.items():
            if not key.endswith("_tuning_us") or not isinstance(entries, dict):
                continue
            kind = key[: -len("_tuning_us")]
            base = row.get(kind + "_us")
            if not base:
                continue
            for entry, us in entries.items():
                if us is None or (not include_all and any(s in entry for s in SKIP)):
                    continue
                gain = 100.0 * (1.0 - us / base)
                noise = 100.0 * 2.0 * max(spread.get(kind, 0.0), spread.get(f"{kind}|{entry}", 0.0))
                if gain > min_percent and gain > noise:
                    out.append((row_label(row), kind, entry, base, us, gain))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--min", type=float, default=3.0, help="smallest gain reported, percent (default 3)")
    parser.add_argument("--all", action="store_true", help="include pdl= and cursors_aligned entries")
    args = parser.parse_args(argv)
    found = 0
    for path in args.files:
        with open(path) as f:
            doc = json.load(f)
        for label, kind, entry, base, us, gain in leads(doc, args.min, args.all):
            print(f"{os.path.basename(path)}: {label}, {kind}: {entry} {us:.2f} us against the default's {base:.2f} (-{gain:.1f}%)")
            found += 1
    if found == 0:
        print(f"no tune entry beats its default by more than {args.min}% in {len(args.files)} file(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
