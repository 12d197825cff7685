"""Where a verify launch's time goes, block by block. DIAGNOSTIC: needs a timeline patch applied and built:
bench/patches/gdn-verify-timeline.patch (GDN; gdn-verify-timeline-re.patch on top of gdn-verify-ring-early.patch) or
bench/patches/verify-timeline-m2.patch (Mamba-2), or for the GDN replay step (--op replay)
bench/patches/gdn-replay-timeline.patch; without one it stops with a message.

With REPLAYSSM_TUNE gdn_verify_timeline=1 (GDN) or verify_timeline=1 (Mamba-2) every verify block records clock64 and %globaltimer at six points: entry,
slot known (its slot_ids load consumed), prologue loads landed (the cursor, the window, the committed ring: after the
barrier that follows their wait), prologue done (block scalars, weights, B fragments), row loop done, end; the
launcher prints the table. This script sets up the benchmark's layer (GDN: HV=32, H=16, K=V=128; Mamba-2: H=128, P=64,
N=128, G=8; fp32 checkpoint, bf16 activations, ring 12), puts the cursors where asked, runs one verify with the timeline on, and prints:
  - per phase (to_slot, to_landed, scalars, row_loop, epilogue; prologue = the first three; block), the mean and
    percentiles of the blocks' durations (us, from clock64 at the SM clock measured over the launch), for blocks
    that fold early and blocks that do not;
  - the launch's span, and each SM's busy time (union of its blocks' intervals), blocks resident over time;
  - what the span would be at the read bandwidth for the bytes the blocks stream.

    python bench/verify_timeline.py [--kind gdn|mamba2] [--batch 256] [--T 4] [--ring-len 12] [--early 0.0] [--runs 3]
                                    [--out tl.json]
    python bench/verify_timeline.py --op replay [--view] [--batch 256] [--ring-len 16] [--early 0.0625] ...

--op replay (GDN only; REPLAYSSM_TUNE gdn_replay_timeline=1): one gdn_replay_step, cursors uniform over
[0, ring_len - 2], --early of the rows at ring_len - 1 (folding steps: 1/L of the rows in a serving batch); --view:
caches with the bf16 output view (the rows stream the view; "early" then marks the folds, which stream the master).

--early: the fraction of rows whose cursor makes the window not fit (an early fold); the others get cursors uniform
over [0, ring_len - T].
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_gdn as gd  # noqa: E402
import bench_gdn_speculative as gs  # noqa: E402
import bench_speculative as ms  # noqa: E402

import replayssm  # noqa: E402

SHAPES = {"gdn": (32, 16, 128, 128), "mamba2": (128, 64, 128, 8)}  # the benchmarks' layers
KNOBS = {"gdn": "gdn_verify_timeline=1", "mamba2": "verify_timeline=1", "replay": "gdn_replay_timeline=1"}
POINTS = 6  # the kernel's marks (kTimelinePoints)
PHASES = (("to_slot", 0, 1), ("to_landed", 1, 2), ("scalars", 2, 3), ("row_loop", 3, 4), ("epilogue", 4, 5),
          ("prologue", 0, 3), ("block", 0, 5))


def capture_stdout(fn):
    """Runs fn() with the process's file descriptor 1 sent to a file (device printf writes there); returns the text."""
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile(mode="w+") as f:
        os.dup2(f.fileno(), 1)
        try:
            fn()
            torch.cuda.synchronize()
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        f.seek(0)
        return f.read()


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def parse(text):
    """The launcher's table: a dict per recorded block (pad rows' blocks record nothing), and the launch's line."""
    rows, meta = [], {}
    for line in text.splitlines():
        if not line.startswith("TL "):
            continue
        parts = line.split()
        if parts[1] == "rows_per_block":
            meta = dict(zip(parts[1::2], map(int, parts[2::2])))
            continue
        v = list(map(int, parts[1:]))
        rows.append(dict(block=v[0], sm=v[1], early=v[2], clk=v[3::2][:POINTS], gt=v[4::2][:POINTS]))
    return [r for r in rows if r["gt"][0] and r["gt"][-1]], meta


def union_length(intervals):
    total, cs, ce = 0, None, None
    for s, e in sorted(intervals):
        if cs is None or s > ce:
            if cs is not None:
                total += ce - cs
            cs, ce = s, e
        else:
            ce = max(ce, e)
    return total + (ce - cs if cs is not None else 0)


def state_bytes(kind, shape):
    """One row's fp32 checkpoint (what the row loop streams)."""
    return shape[0] * shape[2] * shape[3] * 4 if kind == "gdn" else shape[0] * shape[1] * shape[2] * 4


def summarize(text, batch, row_bytes=SHAPES["gdn"][0] * SHAPES["gdn"][2] * SHAPES["gdn"][3] * 4):
    rows, meta = parse(text)
    if not rows:
        sys.exit("no timeline lines: is a timeline patch (bench/patches/*timeline*.patch) applied and built?")
    t0 = min(r["gt"][0] for r in rows)
    span_ns = max(r["gt"][-1] for r in rows) - t0
    # the SM clock from the blocks' own clock64 ticks over their %globaltimer lifetime
    ghz = statistics.median((r["clk"][-1] - r["clk"][0]) / max(1, r["gt"][-1] - r["gt"][0]) for r in rows)
    phases = {}
    for name, a, b in PHASES:
        for kind, sel in (("all", None), ("early", 1), ("plain", 0)):
            xs = [(r["clk"][b] - r["clk"][a]) / ghz / 1e3 for r in rows if sel is None or r["early"] == sel]
            if xs:
                phases[f"{name}_{kind}"] = dict(n=len(xs), mean=statistics.fmean(xs), p10=pct(xs, 0.1), p50=pct(xs, 0.5),
                                                p90=pct(xs, 0.9), max=max(xs))
    by_sm = {}
    for r in rows:
        by_sm.setdefault(r["sm"], []).append((r["gt"][0] - t0, r["gt"][-1] - t0))
    busy = [union_length(ivs) / 1e3 for ivs in by_sm.values()]
    # blocks resident (started, not ended) over the GPU at 100 instants of the span, and how many are in each phase
    samples, in_phase = [], {"prologue": 0, "row_loop": 0, "epilogue": 0}
    for k in range(100):
        t = t0 + span_ns * (k + 0.5) / 100
        live = [r for r in rows if r["gt"][0] <= t < r["gt"][-1]]
        samples.append(len(live))
        for r in live:
            in_phase["prologue" if t < r["gt"][3] else "row_loop" if t < r["gt"][4] else "epilogue"] += 1
    total = max(1, sum(in_phase.values()))
    stream_bytes = batch * row_bytes  # the checkpoint, read once
    return dict(blocks=len(rows), early_blocks=sum(r["early"] for r in rows), sms=len(by_sm), span_us=span_ns / 1e3,
                sm_clock_ghz=ghz, sm_busy_us=dict(mean=statistics.fmean(busy), min=min(busy), max=max(busy)),
                resident_blocks=dict(mean=statistics.fmean(samples), first10=samples[:10], last10=samples[-10:]),
                resident_share_by_phase={k: v / total for k, v in in_phase.items()},
                checkpoint_bytes=stream_bytes, checkpoint_TBps_over_span=stream_bytes / span_ns / 1e3, phases_us=phases,
                launch=meta)


def report(res):
    print(f"run {res.get('run', 0)}: {res['blocks']} blocks ({res['early_blocks']} early) on {res['sms']} SMs, span "
          f"{res['span_us']:.1f} us, SM clock {res['sm_clock_ghz']:.2f} GHz, checkpoint at "
          f"{res['checkpoint_TBps_over_span']:.2f} TB/s over the span; resident blocks mean "
          f"{res['resident_blocks']['mean']:.0f} (by phase: " +
          ", ".join(f"{k} {v:.0%}" for k, v in res["resident_share_by_phase"].items()) + f"); launch {res['launch']}")
    for k, v in res["phases_us"].items():
        print(f"  {k:18s} n {v['n']:5d}  mean {v['mean']:7.2f}  p10 {v['p10']:7.2f}  p50 {v['p50']:7.2f}  "
              f"p90 {v['p90']:7.2f}  max {v['max']:7.2f} us")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=sorted(SHAPES), default="gdn")
    ap.add_argument("--op", choices=["verify", "replay"], default="verify")
    ap.add_argument("--view", action="store_true", help="--op replay: caches with the bf16 output view")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--T", type=int, default=4)
    ap.add_argument("--ring-len", type=int, default=None, help="default: the benchmarks' ring (GDN verify 12, else 16)")
    ap.add_argument("--early", type=float, default=0.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    gen = torch.Generator(device="cuda").manual_seed(0)
    B, T, shape = args.batch, args.T, SHAPES[args.kind]
    L = args.ring_len or (16 if args.op == "replay" or args.kind == "mamba2" else 12)  # the benchmarks' rings
    n_early = int(round(args.early * B))
    if args.op == "replay":
        if args.kind != "gdn":
            sys.exit("--op replay: the GDN replay step only")
        HV, H, K, V = shape
        c = replayssm.GdnReplayCache.allocate(B, HV, H, K, V, ring_len=L, output_view=torch.bfloat16 if args.view else None,
                                              device="cuda")
        c.checkpoint.copy_(torch.randn(c.checkpoint.shape, generator=gen, device="cuda") * 0.1)
        A_log = torch.rand(HV, generator=gen, device="cuda") * math.log(16.0)
        dt_bias = torch.rand(HV, generator=gen, device="cuda") - 4.0
        slots = torch.arange(B, dtype=torch.int32, device="cuda")
        tok = gd.make_inputs(B, 1, 1, shape, gen, "cuda")[0][0]
        cur = torch.randint(0, L - 1, (B,), dtype=torch.int32)
        cur[:n_early] = L - 1  # (a folding step)
    else:
        mod = gs if args.kind == "gdn" else ms
        layer = mod.Layer(B, T, L, shape, gen, "cuda")
        tok = mod.window(B, T, shape, gen, "cuda")
        cur = torch.randint(0, L - T + 1, (B,), dtype=torch.int32)
        if n_early:
            cur[:n_early] = torch.randint(L - T + 1, L + 1, (n_early,), dtype=torch.int32)
        c = layer.cache
    cur = cur[torch.randperm(B)]
    ckpt0 = c.checkpoint.clone()

    def reset():
        c.cursor.copy_(cur)
        if c.pending is not None:
            c.pending.zero_()
        c.arrivals.zero_()
        c.checkpoint.copy_(ckpt0)
        if c.view is not None:
            c.view.copy_(ckpt0)

    def verify():
        if args.op == "replay":
            replayssm.gdn_replay_step(c, tok["q"], tok["k"], tok["v"], tok["a"], tok["b"], A_log, slot_ids=slots,
                                      dt_bias=dt_bias, out=tok["out"])
        elif args.kind == "gdn":
            replayssm.gdn_replay_verify(c, tok["q"], tok["k"], tok["v"], tok["a"], tok["b"], layer.A_log, slot_ids=layer.slots,
                                        dt_bias=layer.dt_bias, out=tok["out"])
        else:
            replayssm.mamba2_replay_verify(c, tok["x"], tok["dt"], layer.A, tok["B"], tok["C"], z=tok["z"], slot_ids=layer.slots,
                                           out=tok["out"], **layer.kw)

    for _ in range(3):  # warm: the kernel's code, the tables
        reset()
        verify()
    torch.cuda.synchronize()
    results = []
    for run in range(args.runs):
        reset()
        torch.cuda.synchronize()
        os.environ["REPLAYSSM_TUNE"] = KNOBS["replay" if args.op == "replay" else args.kind]
        try:
            text = capture_stdout(verify)
        finally:
            del os.environ["REPLAYSSM_TUNE"]
        res = summarize(text, B, state_bytes(args.kind, shape) // (2 if args.view else 1))
        res["run"] = run
        results.append(res)
        report(res)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(args=vars(args), device=torch.cuda.get_device_name(), results=results), f, indent=1)
        print("wrote", args.out)


if __name__ == "__main__":
    main()
