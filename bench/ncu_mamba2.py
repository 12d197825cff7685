"""Confirms the bytes that the Mamba-2 kernels move with Nsight Compute's DRAM counters, against the analytic
count of bench_mamba2.py: one full cycle of L steps of each kernel at one batch size, one layer (its state is
far larger than the L2), counters summed over the cycle and divided by L.

    python bench/ncu_mamba2.py [--batch 256] [--out bench/results/mamba2_ncu.json]
"""
from __future__ import annotations

import argparse
import csv
import io
import math
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_mamba2 as bm  # noqa: E402
import common  # noqa: E402

METRICS = "dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum"


def workload(batch: int, L: int, view: bool = False) -> None:
    import replayssm
    from replayssm import Mamba2ReplayCache
    gen = torch.Generator(device="cuda").manual_seed(0)
    inputs = bm.make_inputs(batch, 1, L, gen)
    A = -torch.exp(torch.rand(bm.H, device="cuda") * math.log(16.0))
    slots = torch.arange(batch, dtype=torch.int32, device="cuda")
    kw = dict(dt_bias=torch.rand(bm.H, device="cuda") - 4.0, D=torch.randn(bm.H, device="cuda"), dt_softplus=True)
    pool = torch.randn(batch, bm.H, bm.P, bm.N, device="cuda") * 0.1
    for step in inputs:
        t = step[0]
        replayssm.mamba2_step(pool, t["x"], t["dt"], A, t["B"], t["C"], z=t["z"], slot_ids=slots, out=t["out"], **kw)
    del pool
    cache = Mamba2ReplayCache.allocate(batch, bm.H, bm.P, bm.G, bm.N, ring_len=L, act_dtype=bm.ACT, device="cuda",
                                       output_view=torch.bfloat16 if view else None)
    cache.cursor.copy_(torch.randint(0, L, (batch,), generator=gen, device="cuda", dtype=torch.int32))
    for step in inputs:
        t = step[0]
        replayssm.mamba2_replay_step(cache, t["x"], t["dt"], A, t["B"], t["C"], z=t["z"], slot_ids=slots,
                                     out=t["out"], **kw)
    torch.cuda.synchronize()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--ring-len", type=int, default=16)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--view", action="store_true", help="(with --child, for profiling) the replay cache with a bf16 output view")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "mamba2_ncu.json"))
    args = parser.parse_args()
    if args.child:
        workload(args.batch, args.ring_len, args.view)
        return
    cmd = ["ncu", "--clock-control", "none", "--metrics", METRICS, "--csv", "--print-units", "base",
           "-k", "regex:mamba2_(step|replay_step)_kernel", sys.executable, os.path.abspath(__file__), "--child",
           "--batch", str(args.batch), "--ring-len", str(args.ring_len)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    text = proc.stdout
    start = text.find('"ID"')
    if proc.returncode != 0 or start < 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:])
        raise SystemExit("ncu failed")
    totals = {}
    for row in csv.DictReader(io.StringIO(text[start:])):
        kind = "replay" if "replay_step" in row["Kernel Name"] else "standard"
        value = float(row["Metric Value"].replace(",", ""))
        totals.setdefault(kind, {}).setdefault(row["Metric Name"], 0.0)
        totals[kind][row["Metric Name"]] += value
    analytic = bm.analytic_bytes(args.batch, args.ring_len)
    rows = {}
    for kind, m in totals.items():
        measured = (m["dram__bytes_read.sum"] + m["dram__bytes_write.sum"]) / args.ring_len
        rows[kind] = {"measured_bytes_per_step": measured, "analytic_bytes_per_step": analytic[kind],
                      "measured_over_analytic": measured / analytic[kind],
                      "read_bytes_per_step": m["dram__bytes_read.sum"] / args.ring_len,
                      "write_bytes_per_step": m["dram__bytes_write.sum"] / args.ring_len,
                      "ncu_time_us_per_step": m["gpu__time_duration.sum"] / args.ring_len / 1e3}
        print(f"{kind:>8}: measured {measured / 2**20:9.1f} MiB/step, analytic {analytic[kind] / 2**20:9.1f} MiB/step, "
              f"ratio {measured / analytic[kind]:.3f} (read {rows[kind]['read_bytes_per_step'] / 2**20:.1f}, "
              f"write {rows[kind]['write_bytes_per_step'] / 2**20:.1f} MiB)")
    common.write_result(args.out, {"batch": args.batch, "ring_len": args.ring_len, "metrics": METRICS, "kernels": rows})


if __name__ == "__main__":
    main()
