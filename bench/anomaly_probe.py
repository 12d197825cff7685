"""Probe of session 10's timing anomaly (bench/NOTES.md): at batch 256 the Mamba-2 view's default entry and the
same configuration forced (replay_fold_first=1, the same code path) timed 231-238 against 208-215 us in three
runs. Here each configuration is captured as several graphs (REPLAYSSM_TUNE strings that differ only by a key no
kernel reads), all on the same caches, timed interleaved in shuffled rounds (bench/common.py). If graphs of one
configuration agree and the two configurations agree, the anomaly came from the benches' former rotation (each
graph with the same predecessor every round); if graphs of one configuration disagree, from the graphs themselves.

    python bench/anomaly_probe.py [--batch 256] [--copies 3] [--model mamba2|gdn] [--out FILE]
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_gdn as bg  # noqa: E402
import bench_mamba2 as bm  # noqa: E402
import common  # noqa: E402

CONFIGS = {"default": "replay_fold_first=-1", "forced": "replay_fold_first=1", "off": "replay_fold_first=0"}


def view_cycle(model: str, batch: int, L: int, gen):
    """The view replay over one full cycle of a layer stack, as the decode benchmarks build it."""
    if model == "mamba2":
        n_layers = max(2, math.ceil(4 * common.l2_bytes() / (batch * bm.H * bm.P * bm.N * 4)))
        inputs = bm.make_inputs(batch, n_layers, L, gen)
        A = -torch.exp(torch.rand(bm.H, generator=gen, device="cuda") * math.log(16.0))
        kw = dict(D=torch.randn(bm.H, generator=gen, device="cuda"), dt_bias=torch.rand(bm.H, generator=gen, device="cuda") - 4.0,
                  dt_softplus=True)
        slots = torch.arange(batch, dtype=torch.int32, device="cuda")
        _, cycle = bm.replay_caches(batch, n_layers, L, gen, inputs, A, slots, kw, torch.bfloat16)
        return cycle, L * n_layers
    HV, H, K, V = shape = (32, 16, 128, 128)
    n_layers = max(2, math.ceil(4 * common.l2_bytes() / (batch * HV * V * K * 4)))
    inputs = bg.make_inputs(batch, n_layers, L, shape, gen, "cuda")
    A_log = torch.rand(HV, generator=gen, device="cuda") * math.log(16.0)
    dt_bias = torch.rand(HV, generator=gen, device="cuda") - 4.0
    slots = torch.arange(batch, dtype=torch.int32, device="cuda")
    _, cycle = bg.replay_caches(batch, n_layers, L, shape, gen, inputs, A_log, dt_bias, slots, torch.bfloat16)
    return cycle, L * n_layers


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--ring-len", type=int, default=16)
    parser.add_argument("--copies", type=int, default=3, help="graphs per configuration")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--model", choices=["mamba2", "gdn"], default="mamba2")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "anomaly_probe.json"))
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    cycle, per = view_cycle(args.model, args.batch, args.ring_len, gen)
    fns = {(name, k): (cycle, f"{tune},probe_copy={k}") for name, tune in CONFIGS.items() for k in range(args.copies)}
    fns[("unset", 0)] = (cycle, None)  # REPLAYSSM_TUNE as the benchmarks' default entries have it: not set
    times, spreads = common.time_interleaved(fns, rounds=args.rounds)
    rows = {f"{name}#{k}": {"us": t / per, "round_spread": spreads[(name, k)]} for (name, k), t in times.items()}
    print(f"{args.model} view, batch {args.batch}, L {args.ring_len}: us per step and layer")
    for key, r in rows.items():
        print(f"  {key:<10} {r['us']:8.1f}  (spread {100 * r['round_spread']:.1f}%)")
    groups = {}
    for (name, _), t in times.items():
        groups.setdefault("default" if name == "unset" else name, []).append(t / per)
    summary = {name: {"median_us": statistics.median(v), "max_over_min": max(v) / min(v)} for name, v in groups.items()}
    for name, g in summary.items():
        print(f"  {name:<8} median {g['median_us']:.1f} us, copies differ by {100 * (g['max_over_min'] - 1):.1f}%")
    common.write_result(args.out, {"model": args.model, "batch": args.batch, "ring_len": args.ring_len, "configs": CONFIGS,
                                   "rows": rows, "summary": summary})


if __name__ == "__main__":
    main()
