"""Gated DeltaNet decode step microbenchmark (issue 4): fla's fused_recurrent_gated_delta_rule (the standard decode
engines run: read the state, write the new one), replayssm's gdn_step (standard, in place) and gdn_replay_step
(replay over full cycles of L steps, cursors advancing for real), FP32 state, bf16 activations, HV=32 value heads,
H=16 key heads, K=V=128 (Qwen3-Next's GDN layer), timed as bench_mamba2.py times the Mamba-2 steps (CUDA graphs of
whole cycles over enough independent layers that nothing is served from L2).

    python bench/bench_gdn.py [--batches 1 32 128 256] [--ring-len 16] [--out bench/results/gdn_decode.json]
    python bench/bench_gdn.py --smoke     # tiny shapes, eager, CPU: checks the code paths only
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
from replayssm import GdnReplayCache  # noqa: E402

ACT = torch.bfloat16


def load_fla():
    path = os.path.join(os.path.dirname(__file__), "..", "third_party", ".cache", "fla")
    sys.path.insert(0, os.path.abspath(path))
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
        return fused_recurrent_gated_delta_rule
    except Exception as e:  # noqa: BLE001 (any import failure means: no baseline in this run)
        print(f"fla baseline not available ({e}); run third_party/get_baselines.sh")
        return None


def analytic_bytes(batch, L, shape, state_bytes=4, act_bytes=2) -> dict:
    HV, H, K, V = shape
    state = batch * HV * V * K * state_bytes
    io = batch * (2 * H * K * act_bytes + 2 * HV * V * act_bytes + 2 * HV * act_bytes)  # q, k; v, out; a, b
    ring_token = batch * (HV * V * 4 + H * K * 4 + HV * 4)  # u, k, g (fp32)
    standard = 2 * state + io
    replay = state + io + ring_token * (L - 1) / 2 + state / L + ring_token * (L - 1) / L
    # The numerical split: the L - 1 steps that do not fold stream the bf16 view; the fold reads the fp32 master
    # alone (the view is the master rounded: its outputs need no view read) and writes master and view. (Until
    # session 13 the fold's view read counted too: floors 1/L of a view higher.)
    view_state = state // 2
    view = view_state * (L - 1) / L + io + ring_token * (L - 1) / 2 + (2 * state + view_state) / L + ring_token * (L - 1) / L
    return {"standard": standard, "replay": replay, "replay_view": view}


def make_inputs(batch, n_layers, L, shape, gen, device):
    HV, H, K, V = shape

    def rnd(*s):
        return torch.randn(*s, generator=gen, device=device).to(ACT)
    return [[dict(q=rnd(batch, H, K), k=rnd(batch, H, K), v=rnd(batch, HV, V), a=rnd(batch, HV), b=rnd(batch, HV),
                  out=torch.empty(batch, HV, V, dtype=ACT, device=device)) for _ in range(n_layers)] for _ in range(L)]


def replay_caches(batch, n_layers, L, shape, gen, inputs, A_log, dt_bias, slots, view, aligned=False, device="cuda",
                  align_folds=None):
    """Fresh caches (with the bf16 output view when view is set; align_folds as the cache's option, None: its
    default), cursors staggered (all at 0 when aligned), and the function that runs the replay step over one full
    cycle on them (run once already where the folds align: common.settle)."""
    HV, H, K, V = shape
    caches = []
    for _ in range(n_layers):
        cache = GdnReplayCache.allocate(batch, HV, H, K, V, ring_len=L, output_view=view, align_folds=align_folds,
                                        device=device)
        common.fill_cache(cache, L, gen, aligned)
        caches.append(cache)

    def replay_cycle():
        for step in inputs:
            for cache, t in zip(caches, step):
                replayssm.gdn_replay_step(cache, t["q"], t["k"], t["v"], t["a"], t["b"], A_log, slot_ids=slots,
                                          dt_bias=dt_bias, out=t["out"])
    common.settle(caches, replay_cycle)
    return caches, replay_cycle


def bench_batch(batch, L, shape, fla, gen, smoke=False, tune=False, layers=None, tune_kinds=("step", "replay", "view")) -> dict:
    """µs per step and layer of every kernel at one batch size, all timed interleaved in one time_interleaved call
    (with their alternative configurations when tune); smoke: each run once, eagerly, on the CPU."""
    device = "cpu" if smoke else "cuda"
    HV, H, K, V = shape
    state_layer = batch * HV * V * K * 4
    n_layers = 1 if smoke else layers or max(2, math.ceil(4 * common.l2_bytes() / state_layer))
    per = L * n_layers
    A_log = torch.rand(HV, generator=gen, device=device) * math.log(16.0)
    dt_bias = torch.rand(HV, generator=gen, device=device) - 4.0
    slots = torch.arange(batch, dtype=torch.int32, device=device)
    inputs = make_inputs(batch, n_layers, L, shape, gen, device)
    r = {"batch": batch, "layers_rotated": n_layers}

    pools = [torch.randn(batch, HV, V, K, generator=gen, device=device) * 0.1 for _ in range(n_layers)]

    def standard_cycle():
        for step in inputs:
            for pool, t in zip(pools, step):
                replayssm.gdn_step(pool, t["q"], t["k"], t["v"], t["a"], t["b"], A_log, slot_ids=slots, dt_bias=dt_bias,
                                   out=t["out"])
    fns = {"standard": standard_cycle}
    if tune and "step" in tune_kinds:
        fns.update(common.tune_entries(standard_cycle, "standard", STEP_TUNES))

    if fla is not None and not smoke:
        def fla_cycle():
            for step in inputs:
                for pool, t in zip(pools, step):
                    fla(t["q"][:, None], t["k"][:, None], t["v"][:, None], g=t["a"][:, None], beta=t["b"][:, None],
                        initial_state=pool, output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                        A_log=A_log, dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True, state_v_first=True)
        fns["fla"] = fla_cycle

    all_caches = {}
    for view in (None, torch.bfloat16):
        name = "replay" if view is None else "replay_view"
        kind_tuned = tune and ("replay" if view is None else "view") in tune_kinds
        for aligned in (False, True) if kind_tuned else (False,):
            caches, replay_cycle = replay_caches(batch, n_layers, L, shape, gen, inputs, A_log, dt_bias, slots, view,
                                                 aligned, device)
            if aligned:
                common.add_aligned(fns, all_caches, name, caches, replay_cycle)
            else:
                all_caches[name], fns[name] = caches, replay_cycle
                if kind_tuned:
                    fns.update(common.tune_entries(replay_cycle, name, REPLAY_TUNES if view is None else VIEW_TUNES))
                    label, align = common.fold_align_entry(view)
                    common.add_variant(fns, all_caches, name, label,
                                       *replay_caches(batch, n_layers, L, shape, gen, inputs, A_log, dt_bias, slots, view,
                                                      device=device, align_folds=align))
                    if view is not None:  # the aligned view in the lean form (the launcher's choice until session
                        # 50: with the phase's code it spills 44 bytes, ptxas); the same caches, full cycles
                        fns[(name, label + ",stream_lean=1")] = (fns[(name, label)][0], "stream_lean=1")
    before = common.cursors_of(all_caches)
    if smoke:
        times = {name: (fns[name](), 0.0)[1] for name in ("standard", "replay", "replay_view")}
    else:
        times, spreads = common.time_interleaved(fns)
        r["round_spread"] = common.spread_names(spreads)
    common.decode_times(r, times, per, tune, "fla", all_caches, before)
    return r


# Alternative launch configurations (REPLAYSSM_TUNE, listed in csrc/gdn/kernels.cuh), timed with --tune.
STEP_TUNES = ["gdn_step_ahead=0", "gdn_step_ahead=1", "gdn_step_ahead=2", "gdn_step_ahead=4", "gdn_step_threads=128", "gdn_step_hints=1", "gdn_step_rows=16", "gdn_step_rows=32", "gdn_step_rows=64", "gdn_step_threads=32",
              "gdn_step_threads=32,gdn_step_unroll=1,gdn_step_rows=4",
              "gdn_step_threads=32,gdn_step_lanes=32,gdn_step_unroll=4,gdn_step_rows=8", "pdl=1"]
# pdl=1: programmatic dependent launch between the layers' launches (common/cuda_utils.cuh; as in bench_mamba2.py)
# pdl=1,pdl_ring_ahead=0: with PDL, the replay's ring requested after the wait (the default requests it before).
REPLAY_TUNES = ["replay_fold_first=0", "replay_fold_first=1", "gdn_replay_variant=1", "gdn_replay_variant=2", "gdn_replay_variant=0", "gdn_replay_prefetch=0",
                "gdn_replay_prefetch=1", "gdn_replay_rows=32", "gdn_replay_rows=64", "gdn_replay_rows=128", "gdn_replay_rows=256", "gdn_replay_bps=8", "gdn_replay_bps=12",
                "gdn_replay_bps=16", "gdn_replay_bps=24",
                "fold_pair=0", "fold_pair=1", "gdn_replay_split=0", "stream_lean=0", "stream_lean=1", "pdl=1",
                "pdl=1,pdl_ring_ahead=0", "gdn_replay_small=0", "pdl=1,gdn_replay_small=0", "gdn_replay_small=1",
                "replay_stage0_first=0", "gdn_replay_min_rows=0"]
# (gdn_replay_small: the small kernel, csrc/gdn/replay_small.cuh, the default for grids of at most two blocks per SM;
# =0 the general kernel there, =1 the small kernel at any batch; gdn_replay_min_rows=0: the general kernel's blocks as
# the bps split gives them, without the default's floor of 64 rows)
VIEW_TUNES = ["replay_fold_first=0", "replay_fold_first=1", "gdn_view_variant=0", "gdn_replay_rows=256", "gdn_replay_rows=128", "gdn_replay_rows=64", "gdn_replay_split=0",
              "stream_lean=1", "gdn_replay_rows=512", "pdl=1", "pdl=1,pdl_ring_ahead=0",
              "pdl=1,replay_fold_first=0", "replay_stage0_first=0", "gdn_replay_bps=16", "gdn_replay_min_rows=0",
              "fold_phase_code=1", "fold_phase_code=1,stream_lean=1", "order_cursor=0", "view_fold_lean=0"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32, 128, 256])
    parser.add_argument("--ring-len", type=int, default=16)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--tune", action="store_true", help="also time alternative launch configurations")
    parser.add_argument("--tune-kinds", nargs="+", choices=["step", "replay", "view"], default=["step", "replay", "view"],
                        help="with --tune: whose alternatives to time (default all three)")
    common.add_layers_option(parser)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "gdn_decode.json"))
    parser.add_argument("--key-heads", type=int, default=16,
                        help="key heads H (HV = 32 value heads): 8 gives a key head 512 state rows, so that a replay block "
                             "can be twice the benchmark's 256 (gdn_replay_rows=512, a view tune entry)")
    args = parser.parse_args()
    if args.smoke:
        print(bench_batch(3, 4, (4, 2, 16, 8), None, torch.Generator().manual_seed(0), smoke=True))
        return
    if 32 % args.key_heads:
        parser.error("--key-heads must divide the 32 value heads")
    shape = (32, args.key_heads, 128, 128)  # HV, H, K, V
    gen = torch.Generator(device="cuda").manual_seed(0)
    fla = load_fla()
    bw = common.measure_bandwidth()
    rows = []
    for batch in args.batches:
        r = bench_batch(batch, args.ring_len, shape, fla, gen, tune=args.tune, layers=args.layers,
                        tune_kinds=tuple(args.tune_kinds))
        nbytes = analytic_bytes(batch, args.ring_len, shape)
        common.decode_ratios(r, nbytes, bw)
        rows.append(r)
        print(r, flush=True)
    common.write_result(args.out, {"bandwidth": bw, "ring_len": args.ring_len, "shape": dict(zip(("HV", "H", "K", "V"), shape)),
                                   "state_dtype": "float32", "act_dtype": "bfloat16", "rows": rows})
    print(f"\ncopy {bw['copy_TBps']:.2f} TB/s, read {bw['read_TBps']:.2f} TB/s; µs per step and layer, L={args.ring_len}")
    print(f"{'batch':>5} {'fla':>8} {'step':>8} {'step%BW':>8} {'replay':>8} {'floor':>7} {'rep/floor':>9} {'speedup':>8}")
    for r in rows:
        print(f"{r['batch']:>5} {r.get('fla_us', float('nan')):>8.1f} {r['standard_us']:>8.1f} "
              f"{100 * r['standard_frac_copy_bw']:>7.1f}% {r['replay_us']:>8.1f} {r['replay_floor_us']:>7.1f} "
              f"{r['replay_over_floor']:>9.2f} {r['replay_vs_standard']:>7.2f}x")
    common.print_view_and_tunings(rows)


if __name__ == "__main__":
    main()
