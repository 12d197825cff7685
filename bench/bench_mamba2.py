"""Mamba-2 decode step microbenchmark: mamba_ssm's Triton selective_state_update, replayssm's mamba2_step
(standard) and mamba2_replay_step (replay), FP32 state, bf16 activations, as a serving engine runs them.

Each measurement is one CUDA graph holding a full cycle of L consecutive steps over n independent layers
(n chosen so that the layers' states are >= 4x the L2: nothing is served from L2), with fresh inputs for every
(step, layer). The replay cursors advance for real (they start staggered, as in a serving batch), so fold steps
count at their true rate; caches with aligned folds (replayssm/cache.py) run one untimed cycle first, after which
their rows fold together (common.settle). Reported per step and layer: µs, analytic bytes, TB/s, and the floor (bytes over the
bandwidth measured in this run: copy bandwidth for the standard step, the larger of read and copy for replay).

    python bench/bench_mamba2.py [--batches 1 32 128 256] [--out bench/results/mamba2_decode.json]
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import replayssm  # noqa: E402
from replayssm import Mamba2ReplayCache  # noqa: E402

H, P, N, G = 128, 64, 128, 8  # Nemotron-H 8B Mamba-2 layer
ACT = torch.bfloat16


def load_ssu():
    path = os.path.join(os.path.dirname(__file__), "..", "third_party", ".cache", "mamba_ssm_triton")
    sys.path.insert(0, os.path.abspath(path))
    try:
        from mamba_ssm.ops.triton.selective_state_update import selective_state_update
        return selective_state_update
    except ImportError as e:
        print(f"mamba_ssm baseline not available ({e}); run third_party/get_baselines.sh")
        return None


def analytic_bytes(batch: int, L: int, state_bytes: int = 4, act_bytes: int = 2) -> dict:
    """Fewest device-memory bytes per step and layer, averaged over a cycle of L steps."""
    state = batch * H * P * N * state_bytes
    io = batch * (3 * H * P * act_bytes + H * act_bytes + 2 * G * N * act_bytes)  # x, z, out; dt; B, C
    ring_token = batch * (H * P * act_bytes + G * N * act_bytes + H * 4)  # x, B (activation dtype), dt (fp32)
    standard = 2 * state + io
    replay_read = state + io + ring_token * (L - 1) / 2  # a step at cursor w reads w ring tokens
    replay_write = state / L + ring_token * (L - 1) / L  # one fold per cycle; other steps append a token
    # The numerical split: the L - 1 steps that do not fold stream the bf16 view; the fold reads the fp32 master
    # alone (the view is the master rounded: its outputs need no view read) and writes master and view. (Until
    # session 13 the fold's view read counted too: floors 1/L of a view higher.)
    view_state = batch * H * P * N * 2
    view = view_state * (L - 1) / L + io + ring_token * (L - 1) / 2 + (2 * state + view_state) / L + ring_token * (L - 1) / L
    return {"standard": standard, "replay": replay_read + replay_write, "replay_view": view}


def make_inputs(batch, n_layers, L, gen, device="cuda"):
    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device=device) * scale).to(ACT)
    return [[dict(x=rnd(batch, H, P), dt=rnd(batch, H, scale=0.5), B=rnd(batch, G, N), C=rnd(batch, G, N),
                  z=rnd(batch, H, P), out=torch.empty(batch, H, P, dtype=ACT, device=device))
             for _ in range(n_layers)] for _ in range(L)]


# Alternative launch configurations timed beside the defaults with --tune (REPLAYSSM_TUNE, see
# csrc/common/cuda_utils.cuh): the evidence behind the defaults.
# pdl=1 (every kernel): programmatic dependent launch between the layers' launches (common/cuda_utils.cuh; the benchmark's
# graphs rotate independent layers, so no launch reads what the one ahead of it wrote).
# pdl=1,pdl_ring_ahead=0: with PDL, the replay's ring requested after the wait (the default requests it before).
# step_split_loads=1: the step's load order under PDL (state rows, then the inputs) without PDL: the order's own cost.
# step_ahead=1..3: the next row iterations' state in flight (cp.async stages; unroll 2 or 4, at most 2 ahead with 4:
# at batch 32, whose default unroll is 4, step_ahead=2 and =3 time the same kernel).
STEP_TUNES = ["step_ahead=0", "step_ahead=1", "step_ahead=2", "step_ahead=3", "step_ahead=3,step_unroll=2",
              "step_ahead=0,step_unroll=4", "step_unroll=1", "step_unroll=8", "step_unroll=8,step_bps=2", "pdl=1",
              "step_split_loads=1", "step_unroll=1,step_bps=16"]
# (step_unroll=1,step_bps=16: at batch 1, 2048 blocks of 4 rows, mamba_ssm's Triton grid for N = 128)
# (replay_rows=64 and replay_prefetch=1: for batch 1, where the default's 32-row blocks (one row iteration per
# block, 256 blocks, the ring prefetched) leave the replay slower than the step, and for 32 (~4 waves, no prefetch).)
# replay_small=0: the general kernel (v10) where the default takes the small one (grids of at most two blocks per
# SM: batches 1-2 here; csrc/mamba2/replay_small.cuh); the v10 knobs above (replay_rows, replay_prefetch, ...) force v10 too.
# replay_small=1: the small kernel wherever the shape allows (batch 3 and up: whether its gate should widen).
# replay_min_rows=0: v10's blocks as its rows rule gives them (the default takes 128 rows where the rule gives 32-224;
# the view too).
# small_arrive: where the small kernel's blocks announce that they have read the cursor (0, the default: after the barrier).
# replay_fold_first=-1 is the default configuration (tune_knob reads -1 as unset) timed as a separate graph: at batch
# 256 the default entry and identical tune entries differed by 4-11% in session 10 (bench/NOTES.md).
REPLAY_TUNES = ["replay_fold_first=-1", "replay_fold_first=0", "replay_fold_first=1", "replay_rows=64", "replay_rows=128", "replay_rows=256", "replay_rows=512", "replay_prefetch=0", "replay_prefetch=1", "stream_lean=0",
                "fold_pair=0", "fold_pair=1", "replay_sm_rows=0", "pdl=1", "pdl=1,pdl_ring_ahead=0", "replay_small=0",
                "pdl=1,replay_small=0", "small_arrive=1", "small_arrive=2", "pdl=1,small_arrive=1", "replay_small=1",
                "m2_replay_stage0_first=0", "replay_min_rows=0"]
VIEW_TUNES = ["replay_fold_first=-1", "replay_fold_first=0", "replay_fold_first=1", "stream_lean=0", "replay_rows=128", "replay_rows=256",
              "replay_rows=512", "replay_rows=1024", "view_fold_lean=0", "view_bps=3",
              "view_bps=3,replay_rows=256", "pdl=1", "pdl=1,pdl_ring_ahead=0", "pdl=1,replay_fold_first=0",
              "m2_replay_stage0_first=0", "replay_min_rows=0", "order_cursor=0"]  # (with the order kernel ahead PDL is off)
# (the view runs the same kernel and launcher as plain caches; view_fold_lean=0: its folds stream the view too)


def bench_batch(batch, L, ssu, gen, tune=False, layers=None, tune_kinds=("step", "replay", "view")) -> dict:
    """µs per step and layer of every kernel at one batch size, all timed interleaved in one time_interleaved call
    (with their alternative configurations when tune)."""
    state_layer = batch * H * P * N * 4
    n_layers = layers or max(2, math.ceil(4 * common.l2_bytes() / state_layer))
    per = L * n_layers
    A = -torch.exp(torch.rand(H, generator=gen, device="cuda") * math.log(16.0))
    dt_bias = torch.rand(H, generator=gen, device="cuda") - 4.0
    D = torch.randn(H, generator=gen, device="cuda")
    slots = torch.arange(batch, dtype=torch.int32, device="cuda")
    inputs = make_inputs(batch, n_layers, L, gen)
    kw = dict(D=D, dt_bias=dt_bias, dt_softplus=True)
    result = {"batch": batch, "layers_rotated": n_layers}

    pools = [torch.randn(batch, H, P, N, generator=gen, device="cuda") * 0.1 for _ in range(n_layers)]

    def standard_cycle():
        for step in inputs:
            for pool, t in zip(pools, step):
                replayssm.mamba2_step(pool, t["x"], t["dt"], A, t["B"], t["C"], z=t["z"], slot_ids=slots, out=t["out"], **kw)
    fns = {"standard": standard_cycle}
    if tune and "step" in tune_kinds:
        fns.update(common.tune_entries(standard_cycle, "standard", STEP_TUNES))

    if ssu is not None:
        A_t = A[:, None, None].expand(H, P, N)
        D_t, bias_t = D[:, None].expand(H, P), dt_bias[:, None].expand(H, P)
        dts = [[t["dt"][..., None].expand(batch, H, P) for t in step] for step in inputs]

        def ssu_cycle():
            for step, dstep in zip(inputs, dts):
                for pool, t, dt in zip(pools, step, dstep):
                    ssu(pool, t["x"], dt, A_t, t["B"], t["C"], D=D_t, z=t["z"], dt_bias=bias_t, dt_softplus=True,
                        state_batch_indices=slots)
        fns["mamba_ssm"] = ssu_cycle

    all_caches = {}
    for view in (None, torch.bfloat16):
        name = "replay" if view is None else "replay_view"
        all_caches[name], fns[name] = replay_caches(batch, n_layers, L, gen, inputs, A, slots, kw, view)
        tunes = REPLAY_TUNES if view is None else VIEW_TUNES
        if tune and ("replay" if view is None else "view") in tune_kinds:
            fns.update(common.tune_entries(fns[name], name, tunes))
            common.add_aligned(fns, all_caches, name, *replay_caches(batch, n_layers, L, gen, inputs, A, slots, kw, view,
                                                                    aligned=True))
            label, align = common.fold_align_entry(view)
            common.add_variant(fns, all_caches, name, label, *replay_caches(batch, n_layers, L, gen, inputs, A, slots, kw,
                                                                           view, align_folds=align))
    before = common.cursors_of(all_caches)
    times, spreads = common.time_interleaved(fns)
    common.decode_times(result, times, per, tune, "mamba_ssm", all_caches, before)
    result["round_spread"] = common.spread_names(spreads)
    del pools, all_caches
    torch.cuda.empty_cache()
    return result


def replay_caches(batch, n_layers, L, gen, inputs, A, slots, kw, view, aligned=False, align_folds=None):
    """Fresh caches (with the bf16 output view when view is set; align_folds as the cache's option, None: its
    default), cursors staggered (all at 0 when aligned), and the function that runs the replay step over one full
    cycle on them (run once already where the folds align: common.settle)."""
    caches = []
    for _ in range(n_layers):
        cache = Mamba2ReplayCache.allocate(batch, H, P, G, N, ring_len=L, act_dtype=ACT, output_view=view,
                                           align_folds=align_folds, device="cuda")
        common.fill_cache(cache, L, gen, aligned)
        caches.append(cache)

    def replay_cycle():
        for step in inputs:
            for cache, t in zip(caches, step):
                replayssm.mamba2_replay_step(cache, t["x"], t["dt"], A, t["B"], t["C"], z=t["z"], slot_ids=slots,
                                             out=t["out"], **kw)
    common.settle(caches, replay_cycle)
    return caches, replay_cycle


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32, 128, 256])
    parser.add_argument("--ring-len", type=int, default=16)
    parser.add_argument("--tune", action="store_true", help="also time alternative launch configurations")
    parser.add_argument("--tune-kinds", nargs="+", choices=["step", "replay", "view"], default=["step", "replay", "view"],
                        help="with --tune: whose alternatives to time (default all three)")
    common.add_layers_option(parser)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "mamba2_decode.json"))
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    ssu = load_ssu()
    bw = common.measure_bandwidth()
    rows = []
    for batch in args.batches:
        r = bench_batch(batch, args.ring_len, ssu, gen, tune=args.tune, layers=args.layers,
                        tune_kinds=tuple(args.tune_kinds))
        nbytes = analytic_bytes(batch, args.ring_len)
        common.decode_ratios(r, nbytes, bw)
        r["standard_TBps"] = nbytes["standard"] / r["standard_us"] / 1e6
        r["replay_TBps"] = nbytes["replay"] / r["replay_us"] / 1e6
        if "mamba_ssm_us" in r:
            r["mamba_ssm_TBps"] = nbytes["standard"] / r["mamba_ssm_us"] / 1e6
        rows.append(r)
        print(r, flush=True)
    common.write_result(args.out, {"bandwidth": bw, "ring_len": args.ring_len, "shape": dict(H=H, P=P, N=N, G=G),
                                   "state_dtype": "float32", "act_dtype": "bfloat16", "rows": rows})
    print(f"\ncopy {bw['copy_TBps']:.2f} TB/s, read {bw['read_TBps']:.2f} TB/s; µs per step and layer, L={args.ring_len}")
    print(f"{'batch':>5} {'mamba_ssm':>10} {'step':>8} {'step%BW':>8} {'replay':>8} {'floor':>7} {'rep/floor':>9} {'speedup':>8}")
    for r in rows:
        print(f"{r['batch']:>5} {r.get('mamba_ssm_us', float('nan')):>10.1f} {r['standard_us']:>8.1f} "
              f"{100 * r['standard_frac_copy_bw']:>7.1f}% {r['replay_us']:>8.1f} {r['replay_floor_us']:>7.1f} "
              f"{r['replay_over_floor']:>9.2f} {r['replay_vs_standard']:>7.2f}x")
    common.print_view_and_tunings(rows)


if __name__ == "__main__":
    main()
