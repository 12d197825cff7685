"""Confirms the bytes that the decode kernels move with Nsight Compute's DRAM counters, against the analytic counts
of bench_mamba2.py and bench_gdn.py: one full cycle of L steps of each kernel at one batch size, one layer (its
state is far larger than the L2), counters summed over the cycle and divided by L. Kernels: the standard step, the
replay step, and the replay step of a cache with a bf16 output view, for Mamba-2 (Nemotron-H 8B layer) and Gated
DeltaNet (HV=32, H=16, K=V=128).

    python bench/ncu_bytes.py [--batch 256] [--ring-len 16] [--models mamba2 gdn] [--out bench/results/ncu_bytes.json]
    python bench/ncu_bytes.py --child --model mamba2 [--view] [--batch 1]   # the workload alone (for profiling)
    python bench/ncu_bytes.py --per-launch [--batch 256]   # every cursor at 0: each launch's time and bytes, so that
                                                           # the fold step's cost shows apart from the others'
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
import bench_gdn as bg  # noqa: E402
import bench_mamba2 as bm  # noqa: E402
import common  # noqa: E402

METRICS = "dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum"
# Per launch also the warp instructions and the shared-memory wavefronts (which of the two bounds a launch).
PER_LAUNCH_METRICS = METRICS + ",smsp__inst_executed.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum"
GDN_SHAPE = (32, 16, 128, 128)  # HV, H, K, V
DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "ncu_bytes.json")
KERNELS = {"mamba2": "mamba2_(step|replay_step)_kernel", "gdn": "gdn_(step|replay_step)_kernel"}


def mamba2_workload(batch: int, L: int, view: bool, standard: bool, cursor: int | None = None) -> None:
    import replayssm
    from replayssm import Mamba2ReplayCache
    gen = torch.Generator(device="cuda").manual_seed(0)
    inputs = bm.make_inputs(batch, 1, L, gen)
    A = -torch.exp(torch.rand(bm.H, device="cuda") * math.log(16.0))
    slots = torch.arange(batch, dtype=torch.int32, device="cuda")
    kw = dict(dt_bias=torch.rand(bm.H, device="cuda") - 4.0, D=torch.randn(bm.H, device="cuda"), dt_softplus=True)
    if standard:
        pool = torch.randn(batch, bm.H, bm.P, bm.N, device="cuda") * 0.1
        for step in inputs:
            t = step[0]
            replayssm.mamba2_step(pool, t["x"], t["dt"], A, t["B"], t["C"], z=t["z"], slot_ids=slots, out=t["out"], **kw)
        del pool
    cache = Mamba2ReplayCache.allocate(batch, bm.H, bm.P, bm.G, bm.N, ring_len=L, act_dtype=bm.ACT, device="cuda",
                                       output_view=torch.bfloat16 if view else None)
    common.start_cursors(cache, L, gen, cursor)
    for step in inputs:
        t = step[0]
        replayssm.mamba2_replay_step(cache, t["x"], t["dt"], A, t["B"], t["C"], z=t["z"], slot_ids=slots,
                                     out=t["out"], **kw)
    torch.cuda.synchronize()


def gdn_workload(batch: int, L: int, view: bool, standard: bool, cursor: int | None = None) -> None:
    import replayssm
    from replayssm import GdnReplayCache
    HV, H, K, V = GDN_SHAPE
    gen = torch.Generator(device="cuda").manual_seed(0)
    inputs = bg.make_inputs(batch, 1, L, GDN_SHAPE, gen, "cuda")
    A_log = torch.rand(HV, device="cuda") * math.log(16.0)
    dt_bias = torch.rand(HV, device="cuda") - 4.0
    slots = torch.arange(batch, dtype=torch.int32, device="cuda")
    if standard:
        pool = torch.randn(batch, HV, V, K, device="cuda") * 0.1
        for step in inputs:
            t = step[0]
            replayssm.gdn_step(pool, t["q"], t["k"], t["v"], t["a"], t["b"], A_log, slot_ids=slots, dt_bias=dt_bias,
                               out=t["out"])
        del pool
    cache = GdnReplayCache.allocate(batch, HV, H, K, V, ring_len=L, output_view=torch.bfloat16 if view else None,
                                    device="cuda")
    cache.checkpoint.copy_(torch.randn(cache.checkpoint.shape, device="cuda") * 0.1)
    if cache.view is not None:
        cache.view.copy_(cache.checkpoint)
    common.start_cursors(cache, L, gen, cursor)
    for step in inputs:
        t = step[0]
        replayssm.gdn_replay_step(cache, t["q"], t["k"], t["v"], t["a"], t["b"], A_log, slot_ids=slots,
                                  dt_bias=dt_bias, out=t["out"])
    torch.cuda.synchronize()


def measure(model: str, view: bool, batch: int, L: int) -> dict:
    """{kernel kind: summed metrics} of one cycle of each kernel, from one ncu run of the child workload."""
    cmd = ["ncu", "--clock-control", "none", "--metrics", METRICS, "--csv", "--print-units", "base",
           "-k", f"regex:{KERNELS[model]}", sys.executable, os.path.abspath(__file__), "--child", "--model", model,
           "--batch", str(batch), "--ring-len", str(L)] + (["--view"] if view else [])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    text = proc.stdout
    start = text.find('"ID"')
    if proc.returncode != 0 or start < 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:])
        raise SystemExit(f"ncu failed ({model}, view={view})")
    totals = {}
    for row in csv.DictReader(io.StringIO(text[start:])):
        kind = ("replay_view" if view else "replay") if "replay_step" in row["Kernel Name"] else "standard"
        totals.setdefault(kind, {}).setdefault(row["Metric Name"], 0.0)
        totals[kind][row["Metric Name"]] += float(row["Metric Value"].replace(",", ""))
    return totals


def per_launch(batch: int, L: int, out: str, models=None, views=(False, True)) -> None:
    """Each replay launch's ncu time and DRAM bytes over one cycle with every cursor at 0: the step that folds
    apart from those that do not (the benchmark's random cursors mix them in every launch). Written to out."""
    result = {"batch": batch, "ring_len": L, "metrics": PER_LAUNCH_METRICS, "cursors": "all at 0", "launches": {}}
    for model in sorted(models or KERNELS):
        for view in views:
            cmd = ["ncu", "--clock-control", "none", "--metrics", PER_LAUNCH_METRICS, "--csv", "--print-units", "base",
                   "-k", "regex:replay_step", sys.executable, os.path.abspath(__file__), "--child", "--model", model,
                   "--batch", str(batch), "--ring-len", str(L), "--cursor", "0", "--view" if view else "--no-standard"]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            start = proc.stdout.find('"ID"')
            if proc.returncode != 0 or start < 0:
                print(proc.stdout[-3000:], proc.stderr[-3000:])
                raise SystemExit(f"ncu failed ({model}, view={view})")
            launches = {}
            for row in csv.DictReader(io.StringIO(proc.stdout[start:])):
                launches.setdefault(int(row["ID"]), {})[row["Metric Name"]] = float(row["Metric Value"].replace(",", ""))
            print(f"{model} {'view' if view else 'replay'} batch {batch}, L {L}, every cursor from 0:")
            result["launches"][f"{model}_{'view' if view else 'replay'}"] = [
                {"us": m["gpu__time_duration.sum"] / 1e3, "read_bytes": m["dram__bytes_read.sum"],
                 "write_bytes": m["dram__bytes_write.sum"], "warp_instructions": m.get("smsp__inst_executed.sum", 0.0),
                 "shared_wavefronts": m.get("l1tex__data_pipe_lsu_wavefronts_mem_shared.sum", 0.0)}
                for _, m in sorted(launches.items())]
            for i, (_, m) in enumerate(sorted(launches.items())):
                print(f"  launch {i:2d}: {m['gpu__time_duration.sum'] / 1e3:8.1f} us  read {m['dram__bytes_read.sum'] / 2**20:8.1f} MiB"
                      f"  write {m['dram__bytes_write.sum'] / 2**20:8.1f} MiB"
                      f"  instr {m.get('smsp__inst_executed.sum', 0.0) / 1e6:7.1f}M"
                      f"  shared wavefronts {m.get('l1tex__data_pipe_lsu_wavefronts_mem_shared.sum', 0.0) / 1e6:7.1f}M")
    common.write_result(out, result)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--ring-len", type=int, default=16)
    parser.add_argument("--models", nargs="+", choices=sorted(KERNELS), default=["mamba2", "gdn"])
    parser.add_argument("--child", action="store_true", help="run one model's workload only (for profiling)")
    parser.add_argument("--model", choices=sorted(KERNELS), default="mamba2", help="(with --child) the workload's model")
    parser.add_argument("--view", action="store_true", help="(with --child) replay caches with a bf16 output view, "
                        "and no standard step")
    parser.add_argument("--cursor", type=int, default=None, help="(with --child) every cursor starts here, not at random")
    parser.add_argument("--no-standard", action="store_true", help="(with --child) the replay steps only")
    parser.add_argument("--per-launch", action="store_true", help="each replay launch's time and bytes, cursors from 0")
    parser.add_argument("--view-only", action="store_true", help="(with --per-launch) the caches with a view only")
    parser.add_argument("--out", default=DEFAULT_OUT)
    args = parser.parse_args()
    if args.child:
        workload = mamba2_workload if args.model == "mamba2" else gdn_workload
        workload(args.batch, args.ring_len, view=args.view, standard=not (args.view or args.no_standard), cursor=args.cursor)
        return
    if args.per_launch:
        out = args.out if args.out != DEFAULT_OUT else os.path.join(os.path.dirname(DEFAULT_OUT), f"ncu_per_launch_b{args.batch}.json")
        per_launch(args.batch, args.ring_len, out, args.models, (True,) if args.view_only else (False, True))
        return
    L = args.ring_len
    result = {"batch": args.batch, "ring_len": L, "metrics": METRICS, "gdn_shape": dict(zip(("HV", "H", "K", "V"), GDN_SHAPE))}
    for model in args.models:
        analytic = (bm.analytic_bytes(args.batch, L) if model == "mamba2"
                    else bg.analytic_bytes(args.batch, L, GDN_SHAPE))
        totals = {**measure(model, False, args.batch, L), **measure(model, True, args.batch, L)}
        rows = {}
        for kind, m in totals.items():
            measured = (m["dram__bytes_read.sum"] + m["dram__bytes_write.sum"]) / L
            rows[kind] = {"measured_bytes_per_step": measured, "analytic_bytes_per_step": analytic[kind],
                          "measured_over_analytic": measured / analytic[kind],
                          "read_bytes_per_step": m["dram__bytes_read.sum"] / L,
                          "write_bytes_per_step": m["dram__bytes_write.sum"] / L,
                          "ncu_time_us_per_step": m["gpu__time_duration.sum"] / L / 1e3}
            print(f"{model:>6} {kind:>11}: measured {measured / 2**20:9.1f} MiB/step, analytic "
                  f"{analytic[kind] / 2**20:9.1f} MiB/step, ratio {measured / analytic[kind]:.3f} "
                  f"(read {rows[kind]['read_bytes_per_step'] / 2**20:.1f}, write "
                  f"{rows[kind]['write_bytes_per_step'] / 2**20:.1f} MiB)")
        result[model] = rows
    common.write_result(args.out, result)


if __name__ == "__main__":
    main()
