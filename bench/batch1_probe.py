"""Where batch 1's time goes: the Mamba-2 decode kernels' own durations against the per-layer time of their graphs.

At batch 1 (Nemotron-H 8B layer) a layer's step is ~5.2 us in a CUDA graph, for mamba_ssm's Triton step, replayssm's
step and its replay step alike, while each moves only 4-8 MiB. Two questions separate the launch from the kernel:

  --launch-floor   per-node time of CUDA graphs of empty Triton kernels with each kernel's grid shape (blocks x
                   threads), n nodes back to back: what a node costs before it does any work.
  --child KIND     KIND in step, replay, ssu: that kernel alone, eagerly, over layers rotated so that no state is in
                   the L2 (as in bench_mamba2.py), for ncu to time each launch (gpu__time_duration) without the
                   graph's gaps: `ncu --clock-control none --cache-control none -k regex:K -s 200 -c 40 --metrics ...
                   python bench/batch1_probe.py --child step`. `--profile` runs that for the three kinds and
                   prints the median duration of each kernel.

    python bench/batch1_probe.py --launch-floor --profile [--out bench/results/batch1_probe.json]
"""
from __future__ import annotations

import argparse
import csv
import io
import math
import os
import statistics
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_mamba2 as bm  # noqa: E402
import common  # noqa: E402

KERNELS = {"step": "mamba2_step_kernel", "replay": "mamba2_replay_step", "ssu": "selective_scan_update"}
METRICS = ("gpu__time_duration.sum,sm__cycles_elapsed.max,launch__grid_size,launch__block_size,"
           "launch__registers_per_thread,dram__bytes_read.sum,dram__bytes_write.sum,smsp__inst_executed.sum")


def child(kind: str, cycles: int, L: int = 16) -> None:
    import replayssm
    batch = 1
    gen = torch.Generator(device="cuda").manual_seed(0)
    n_layers = max(2, math.ceil(4 * common.l2_bytes() / (batch * bm.H * bm.P * bm.N * 4)))
    inputs = bm.make_inputs(batch, n_layers, L, gen)
    A = -torch.exp(torch.rand(bm.H, generator=gen, device="cuda") * math.log(16.0))
    dt_bias = torch.rand(bm.H, generator=gen, device="cuda") - 4.0
    D = torch.randn(bm.H, generator=gen, device="cuda")
    slots = torch.arange(batch, dtype=torch.int32, device="cuda")
    kw = dict(D=D, dt_bias=dt_bias, dt_softplus=True)
    if kind == "replay":
        _, cycle = bm.replay_caches(batch, n_layers, L, gen, inputs, A, slots, kw, None)
    else:
        pools = [torch.randn(batch, bm.H, bm.P, bm.N, generator=gen, device="cuda") * 0.1 for _ in range(n_layers)]
        if kind == "step":
            def cycle():
                for step in inputs:
                    for pool, t in zip(pools, step):
                        replayssm.mamba2_step(pool, t["x"], t["dt"], A, t["B"], t["C"], z=t["z"], slot_ids=slots,
                                              out=t["out"], **kw)
        else:
            ssu = bm.load_ssu()
            A_t = A[:, None, None].expand(bm.H, bm.P, bm.N)
            D_t, bias_t = D[:, None].expand(bm.H, bm.P), dt_bias[:, None].expand(bm.H, bm.P)

            def cycle():
                for step in inputs:
                    for pool, t in zip(pools, step):
                        ssu(pool, t["x"], t["dt"][..., None].expand(batch, bm.H, bm.P), A_t, t["B"], t["C"], D=D_t,
                            z=t["z"], dt_bias=bias_t, dt_softplus=True, state_batch_indices=slots)
    for _ in range(cycles):
        cycle()
    torch.cuda.synchronize()


def profile(kind: str, skip: int, count: int, cycles: int) -> dict:
    """ncu over `count` launches of one kind (after `skip`), L2 and clocks left alone: each metric's median."""
    cmd = ["ncu", "--clock-control", "none", "--cache-control", "none", "-k", f"regex:{KERNELS[kind]}", "-s", str(skip),
           "-c", str(count), "--metrics", METRICS, "--csv", "--page", "raw",
           sys.executable, os.path.abspath(__file__), "--child", kind, "--cycles", str(cycles)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith('"')]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"ncu failed for {kind}: {out.stderr[-2000:]}{out.stdout[-2000:]}")
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    rows = [r for r in rows if r.get("ID", "").isdigit()]  # (the row after the header gives units)
    res = {"launches": len(rows), "kernel": rows[0]["Kernel Name"][:160]}
    for m in METRICS.split(","):
        vals = [float(r[m].replace(",", "")) for r in rows if r.get(m) not in (None, "", "n/a")]
        if vals:
            res[m] = statistics.median(vals)
            if m == "gpu__time_duration.sum":
                res[m + "_min"], res[m + "_max"] = min(vals), max(vals)
    return res


def launch_floor(n_nodes: int = 960) -> dict:
    """Per-node µs of graphs of n_nodes empty Triton kernels, one graph per (blocks, warps) shape."""
    import triton
    import triton.language as tl

    @triton.jit
    def empty(x_ptr, n):
        pid = tl.program_id(0)
        if pid > n:  # never: keeps the argument live
            tl.store(x_ptr, pid)

    @triton.jit
    def empty_args(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31, a32, a33, a34, a35, a36, a37, a38, a39, a40, a41, a42, a43, a44, a45, a46, a47, n):  # 48 pointers (384 bytes of parameters), as large as replayssm's params struct
        pid = tl.program_id(0)
        if pid > n:
            tl.store(a0, pid)

    @triton.jit
    def touch(x_ptr, n):  # one 4-byte load and store per program, from a buffer past the L2
        pid = tl.program_id(0)
        v = tl.load(x_ptr + pid * 32)
        tl.store(x_ptr + pid * 32, v + 1.0)

    region = 2048 * 32  # a 128-byte line per program of the largest grid; a region per node: 240 MiB in all
    buf = torch.zeros(n_nodes * region, device="cuda")
    shapes = {"1024x128 (step)": (1024, 4), "2048x128 (mamba_ssm)": (2048, 4), "128x256 (small replay)": (128, 8),
              "132x128": (132, 4)}
    fns = {}
    for name, (blocks, warps) in shapes.items():
        def f(blocks=blocks, warps=warps):
            for _ in range(n_nodes):
                empty[(blocks,)](buf, blocks, num_warps=warps)
        fns["empty " + name] = f
    def f48():
        for _ in range(n_nodes):
            empty_args[(1024,)](*([buf] * 48), 1024, num_warps=4)
    fns["empty 1024x128, 48 pointer arguments"] = f48
    for name, (blocks, warps) in list(shapes.items())[:2]:
        def g(blocks=blocks, warps=warps):
            for i in range(n_nodes):
                touch[(blocks,)](buf[i * region:], blocks, num_warps=warps)
        fns["touch " + name] = g
    for f in fns.values():  # compile outside the capture
        f()
    torch.cuda.synchronize()
    times, spreads = common.time_interleaved(fns)
    return {name: {"us_per_node": times[name] / n_nodes, "round_spread": spreads[name]} for name in fns}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", choices=sorted(KERNELS))
    parser.add_argument("--cycles", type=int, default=1)
    parser.add_argument("--launch-floor", action="store_true")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "batch1_probe.json"))
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.cycles)
    result = {}
    if args.launch_floor:
        result["launch_floor"] = launch_floor()
        print(result["launch_floor"], flush=True)
    if args.profile:
        # one cycle is 16 steps x 60 layers = 960 launches; skip the first 300 (Triton's compile, cold caches)
        result["ncu"] = {kind: profile(kind, 300, 60, 1) for kind in KERNELS}
        for kind, r in result["ncu"].items():
            print(kind, r, flush=True)
    common.write_result(args.out, result)


if __name__ == "__main__":
    main()
