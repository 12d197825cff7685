"""Speculative verification microbenchmark (issue 3): replayssm's mamba2_replay_verify + mamba2_replay_commit
against what engines do today, on the Nemotron-H 8B Mamba-2 layer, FP32 checkpoint/state, bf16 activations.

Baseline ("per-position states"): the standard step run over the window's T tokens, each writing its own
state (mamba2_step with dst_slot_ids: read state k-1, write state k), and rejection handled the cheapest way
an engine can: no copy, the row's current state becomes the slot of its last accepted token (each row owns
T + 1 slots used as a ring; the index arithmetic runs on the device, inside the graph).
Replay: verify T tokens from the checkpoint and the ring (early fold when the window would not fit), then
commit the accepted count (a cursor move).

Accepted counts: 1 + the number of leading draft tokens accepted, each with probability `rate` (the first token
of a window is always kept: it is the target model's own). Each measurement is one CUDA graph of `steps`
verify+commit steps over enough independent layers that nothing is served from L2, with fresh inputs and
accepted counts for every (step, layer). Reported per step and layer: µs, analytic bytes (from the cursors the
run goes through), the floor, and the ratios the issue asks for (speedup over the baseline, and verify+commit
over one replay step at the same batch, measured in the same run).

    python bench/bench_speculative.py [--batches 32 128 256] [--T 2 4 8] [--rates 0.25 0.5 0.75 1.0]
                                      [--ring-len 12 ...] [--out bench/results/mamba2_speculative.json]
The ring length: 16 for Mamba-2 (12 tokens of history and a window of 4), 12 for GDN (bench_gdn_speculative.py).
Session 17 (H200) had 12 fastest for both, the verify's replay of up to L - T history tokens per row outweighing the
extra folds' bytes. On today's kernels (sessions 39-40, an H100, bench/results/session40/README.md) the Mamba-2 verify
at batch 256 with ring 16 is as fast as 12 or faster at T = 2 and 4 (up to 2.8% at T = 4, accept 0.75), moves 2.7-7.9%
fewer bytes at T = 4 (the analytic count), and loses only at T = 8 below accept 1.0 (2-4%); at batch 32 and 128 the two are within 2%. GDN's ring
16 costs its verify a block per SM (GdnVerifyPassSmem at 256 rows: 61.7 KB with two stages, more than a quarter of
the SM's, so the launcher takes three stages and three blocks of 69.9 KB instead of four of 55.1 KB) and was 5-6% slower
(session 38), so GDN keeps 12.

    python bench/bench_speculative.py --smoke    # tiny shapes, eager, CPU or GPU: checks the code paths only
    python bench/bench_speculative.py --view     # verify streams a bf16 view of the fp32 checkpoint (issue 5)
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass
from typing import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import replayssm  # noqa: E402
from replayssm import Mamba2ReplayCache  # noqa: E402

ACT = torch.bfloat16


def accepted_counts(batch, T, rate, gen, device):
    """(batch,) int32 in [1, T]: 1 + leading successes among the T - 1 draft tokens."""
    ok = (torch.rand(batch, T - 1, generator=gen, device=gen.device) < rate).cpu()
    lead = torch.cumprod(ok.int(), dim=1).sum(dim=1) if T > 1 else torch.zeros(batch, dtype=torch.int64)
    return (1 + lead).to(torch.int32).to(device)


def window(batch, T, shape, gen, device):
    H, P, N, G = shape

    def rnd(*s, scale=1.0):
        return (torch.randn(*s, generator=gen, device=device) * scale).to(ACT)
    return dict(x=rnd(batch, T, H, P), dt=rnd(batch, T, H, scale=0.5), B=rnd(batch, T, G, N), C=rnd(batch, T, G, N),
                z=rnd(batch, T, H, P), out=torch.empty(batch, T, H, P, dtype=ACT, device=device))


VIEW = None  # --view: torch.bfloat16, the caches' output view (Mamba-2)


class Layer:
    def __init__(self, batch, T, L, shape, gen, device):
        H, P, N, G = shape
        self.A = -torch.exp(torch.rand(H, generator=gen, device=device) * math.log(16.0))
        self.kw = dict(D=torch.randn(H, generator=gen, device=device),
                       dt_bias=torch.rand(H, generator=gen, device=device) - 4.0, dt_softplus=True)
        self.slots = torch.arange(batch, dtype=torch.int32, device=device)
        self.cache = Mamba2ReplayCache.allocate(batch, H, P, G, N, ring_len=L, act_dtype=ACT, device=device,
                                                output_view=VIEW)
        self.cache.checkpoint.copy_(torch.randn(self.cache.checkpoint.shape, generator=gen, device=device) * 0.1)
        if self.cache.view is not None:
            self.cache.view.copy_(self.cache.checkpoint)
        # Baseline: row r owns slots r * (T + 1) + (0..T); `head` is the ring index of its current state.
        self.pool = torch.randn(batch * (T + 1), H, P, N, generator=gen, device=device) * 0.1
        self.row_base = torch.arange(batch, device=device, dtype=torch.int32) * (T + 1)
        self.head = torch.zeros(batch, dtype=torch.int32, device=device)


def verify_step(layer, tok, acc, T):
    replayssm.mamba2_replay_verify(layer.cache, tok["x"], tok["dt"], layer.A, tok["B"], tok["C"], z=tok["z"],
                                   slot_ids=layer.slots, out=tok["out"], **layer.kw)
    replayssm.mamba2_replay_commit(layer.cache, layer.slots, acc)


def baseline_step(layer, tok, acc, T):
    for k in range(T):
        src = layer.row_base + (layer.head + k) % (T + 1)
        dst = layer.row_base + (layer.head + k + 1) % (T + 1)
        t = {name: v[:, k] for name, v in tok.items()}
        replayssm.mamba2_step(layer.pool, t["x"], t["dt"], layer.A, t["B"], t["C"], z=t["z"], slot_ids=src,
                              dst_slot_ids=dst, out=t["out"], **layer.kw)
    layer.head.copy_((layer.head + acc) % (T + 1))  # the row's state is now its last accepted token's


def window_bytes(batch, T, L, accs, state, ring_token, io_token, passes=4, view_state=None) -> dict:
    """Average bytes per step (any layer kind, from its per-row state, ring-token and input/output bytes):
    verify+commit, following the cursors through `passes` replays of the step sequence from empty rings and
    averaging the last (the steady state the timing sees), and the per-position baseline. With a view
    (view_state: its bytes per row) verify reads the view, and an early fold also reads and writes the master
    and writes the view."""
    read, fold_extra = (state, state) if view_state is None else (view_state, 2 * state + view_state)
    cur = torch.zeros(batch, dtype=torch.int64)
    for _ in range(passes):
        verify = 0.0
        for acc in accs:
            fold = cur + T > L
            verify += batch * (read + T * io_token + T * ring_token) + float(cur.sum()) * ring_token
            verify += float(fold.sum()) * fold_extra
            cur = torch.where(fold, torch.zeros_like(cur), cur) + acc.cpu().long()
    return {"verify": verify / len(accs), "baseline": batch * T * (2 * state + io_token)}


def analytic_bytes(batch, T, L, accs, shape, act_bytes=2, state_bytes=4):
    H, P, N, G = shape
    return window_bytes(batch, T, L, accs, state=H * P * N * state_bytes, view_state=H * P * N * 2 if VIEW is not None else None,
                        ring_token=H * P * act_bytes + G * N * act_bytes + H * 4,  # x, B (activation dtype), dt
                        io_token=3 * H * P * act_bytes + H * act_bytes + 2 * G * N * act_bytes)  # x, z, out; dt; B, C


def replay_step_us(batch, L, shape, gen) -> float:
    """One mamba2_replay_step at this batch (µs per step and layer), timed as in bench_mamba2.py."""
    import bench_mamba2 as bm
    return bm.bench_batch(batch, L, None, gen)["replay_us"]


@dataclass
class Kind:
    """What the benchmark needs of a layer kind."""
    name: str
    shape: tuple  # the benchmark's layer shape
    smoke_shape: tuple
    state_bytes: Callable  # shape -> bytes of one row's state
    Layer: type  # Layer(batch, T, L, shape, gen, device)
    window: Callable  # window(batch, T, shape, gen, device) -> inputs of T tokens
    verify_step: Callable  # (layer, tok, acc, T)
    baseline_step: Callable
    analytic_bytes: Callable  # (batch, T, L, accs, shape) -> {"verify", "baseline"}
    replay_step_us: Callable  # (batch, L, shape, gen)
    tunes: list  # alternative verify kernels (REPLAYSSM_TUNE), timed with --tune
    out: str  # default result file name
    ring_len: int  # the ring timed unless --ring-len says otherwise (see the module docstring)


MAMBA2 = Kind("mamba2", (128, 64, 128, 8), (4, 16, 32, 2), lambda s: s[0] * s[1] * s[2] * 4, Layer, window, verify_step,
              baseline_step, analytic_bytes, replay_step_us, ["verify_rows=256", "verify_rows=512", "verify_rows=1024", "stream_lean=0"], "mamba2_speculative.json",
              ring_len=16)


def bench(kind, batch, T, rate, L, steps, shape, gen, smoke=False, tune=False) -> dict:
    device = "cpu" if smoke else "cuda"
    n_layers = 1 if smoke else max(2, math.ceil(4 * common.l2_bytes() / (batch * kind.state_bytes(shape))))
    layers = [kind.Layer(batch, T, L, shape, gen, device) for _ in range(n_layers)]
    toks = [[kind.window(batch, T, shape, gen, device) for _ in layers] for _ in range(steps)]
    accs = [[accepted_counts(batch, T, rate, gen, device) for _ in layers] for _ in range(steps)]
    nbytes = kind.analytic_bytes(batch, T, L, [a[0] for a in accs], shape)

    def run(fn):
        def cycle():
            for step_toks, step_accs in zip(toks, accs):
                for layer, tok, acc in zip(layers, step_toks, step_accs):
                    fn(layer, tok, acc, T)
        return cycle

    if smoke:
        run(kind.verify_step)()
        run(kind.baseline_step)()
        return {"batch": batch, "T": T, "rate": rate, "bytes": nbytes}
    r = {"batch": batch, "T": T, "rate": rate, "ring_len": L, "steps": steps, "layers_rotated": n_layers, "bytes": nbytes}
    # Every graph runs `steps` steps per replay; cursors and heads go on from where they were (the steady state).
    # All timed interleaved (common.time_interleaved).
    fns = {"verify": run(kind.verify_step), "baseline": run(kind.baseline_step)}
    if tune:
        fns.update(common.tune_entries(fns["verify"], "verify", kind.tunes))
    times, spreads = common.time_interleaved(fns)
    per = steps * n_layers
    r["verify_us"] = times["verify"] / per
    r["baseline_us"] = times["baseline"] / per
    r["speedup"] = r["baseline_us"] / r["verify_us"]
    if tune:
        r["verify_tuning_us"] = common.tunings(times, "verify", per)
    r["round_spread"] = common.spread_names(spreads)
    return r


def ring_table(kind, batches, Ts, rates, lens=(8, 12, 16, 24, 32, 40, 48, 64), steps=64):
    """The bytes side of the ring length's choice (issue 3: "choose the ring size from the bytes"): the analytic bytes of one
    verify+commit step (the window bytes above, early folds at their steady-state rate) for each ring length that
    holds a window (L >= T + 1), per batch, T and accept rate, with the accepted counts the benchmark draws. A short
    ring folds often (each fold reads and writes the checkpoint); a long one is read whole at every step. The least
    bytes (L = 32 at T = 4) is not the least time: the verify's work grows with the history it replays, and the
    measured time chose 12 (the module's docstring)."""
    gen = torch.Generator().manual_seed(0)
    for batch in batches:
        for T in Ts:
            print(f"batch {batch}, T={T}: MiB per verify+commit step for ring length L (* the least)")
            for rate in rates:
                accs = [accepted_counts(batch, T, rate, gen, "cpu") for _ in range(steps)]
                got = {L: kind.analytic_bytes(batch, T, L, accs, kind.shape)["verify"] / 2**20 for L in lens if L >= T + 1}
                best = min(got, key=got.get)
                print(f"  rate {rate:.2f}: " + "  ".join(f"{L}: {v:.0f}{'*' if L == best else ''}" for L, v in got.items()))


def main(kind=MAMBA2):
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 128, 256])
    parser.add_argument("--T", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--rates", type=float, nargs="+", default=[0.25, 0.5, 0.75, 1.0])
    parser.add_argument("--ring-len", type=int, nargs="+", default=[kind.ring_len],
                        help="ring lengths to time (each T with every length that holds its window, L >= T + 1)")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--tune", action="store_true", help="also time the alternative verify kernels")
    parser.add_argument("--view", action="store_true", help="caches with a bf16 output view (Mamba-2; the numerical split)")
    parser.add_argument("--ring-table", action="store_true",
                        help="print the analytic verify+commit bytes per step for ring lengths 8..64 (no GPU) and exit")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", kind.out))
    args = parser.parse_args()
    if args.ring_table:
        ring_table(kind, args.batches, args.T, args.rates)
        return
    if args.view:
        if kind.name != "mamba2":
            raise SystemExit(f"--view: {kind.name} verify has no CUDA view path yet")
        global VIEW
        VIEW = torch.bfloat16
        if args.out == os.path.join(os.path.dirname(__file__), "results", kind.out):
            args.out = args.out.replace(".json", "_view.json")
    if args.smoke:
        gen = torch.Generator().manual_seed(0)
        for T in (2, 4):
            print(bench(kind, 3, T, 0.5, 8, 5, kind.smoke_shape, gen, smoke=True))
        return
    gen = torch.Generator(device="cuda").manual_seed(0)
    bw = common.measure_bandwidth()
    rows = []
    for batch in args.batches:
        one_step = kind.replay_step_us(batch, 16, kind.shape, gen)
        for T in args.T:
            for L, rate in [(L, rate) for L in args.ring_len if L >= T + 1 for rate in args.rates]:
                r = bench(kind, batch, T, rate, L, args.steps, kind.shape, gen, tune=args.tune)
                r["replay_step_us"] = one_step
                r["verify_over_replay_step"] = r["verify_us"] / one_step
                r["verify_floor_us"] = r["bytes"]["verify"] / (max(bw["read_TBps"], bw["copy_TBps"]) * 1e6)
                r["baseline_floor_us"] = r["bytes"]["baseline"] / (bw["copy_TBps"] * 1e6)
                rows.append(r)
                print(r, flush=True)
    names = ("H", "P", "N", "G") if kind.name == "mamba2" else ("HV", "H", "K", "V")
    common.write_result(args.out, {"bandwidth": bw, "layer": kind.name, "shape": dict(zip(names, kind.shape)),
                                   "state_dtype": "float32", "act_dtype": "bfloat16",
                                   "output_view": "bfloat16" if VIEW is not None else None, "rows": rows})
    print(f"\n{'batch':>5} {'T':>2} {'L':>3} {'rate':>5} {'baseline':>9} {'verify':>8} {'floor':>7} {'speedup':>8} {'/replay':>8}")
    for r in rows:
        print(f"{r['batch']:>5} {r['T']:>2} {r['ring_len']:>3} {r['rate']:>5.2f} {r['baseline_us']:>9.1f} {r['verify_us']:>8.1f} "
              f"{r['verify_floor_us']:>7.1f} {r['speedup']:>7.2f}x {r['verify_over_replay_step']:>7.2f}x  "
              f"(spread {100 * max(r['round_spread'].values()):.1f}%) "
              + " ".join(f"{k}: {v:.1f}" for k, v in r.get("verify_tuning_us", {}).items()))


if __name__ == "__main__":
    main()
