"""Gated DeltaNet speculative verification microbenchmark (issue 4): gdn_replay_verify + mamba2_replay_commit against
the per-position-state baseline, HV=32 value heads, H=16 key heads, K=V=128, FP32 checkpoint/state, bf16
activations, timed as bench_speculative.py times the Mamba-2 ops (CUDA graphs of `steps` verify+commit steps over
enough independent layers that nothing is served from L2; accepted counts 1 + leading accepted drafts).

Baseline: the standard step over the window's T tokens, each reading a full state and writing a full state, as
engines that keep a state per draft position do. gdn_step has no separate destination slot (mamba2_step's
dst_slot_ids), so each token k steps, in place, a state of its own in a pool of T states per row: the same
bytes and work per token as reading state k-1 and writing state k; rejection costs nothing (the row's state
becomes its last accepted token's, an index). The baseline's outputs are not the chained recurrence's; only its
cost is measured.

    python bench/bench_gdn_speculative.py [--batches 32 128 256] [--T 2 4 8] [--rates 0.25 0.5 0.75 1.0]
                                          [--ring-len 32] [--tune] [--out bench/results/gdn_speculative.json]
    python bench/bench_gdn_speculative.py --smoke    # tiny shapes, eager, CPU: checks the code paths only
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from bench_speculative import accepted_counts  # noqa: E402

import replayssm  # noqa: E402
from replayssm import GdnReplayCache  # noqa: E402

ACT = torch.bfloat16
VERIFY_TUNES = ["gdn_verify_variant=1"]  # alternative verify kernels (REPLAYSSM_TUNE), timed with --tune


def window(batch, T, shape, gen, device):
    HV, H, K, V = shape

    def rnd(*s):
        return torch.randn(*s, generator=gen, device=device).to(ACT)
    return dict(q=rnd(batch, T, H, K), k=rnd(batch, T, H, K), v=rnd(batch, T, HV, V), a=rnd(batch, T, HV),
                b=rnd(batch, T, HV), out=torch.empty(batch, T, HV, V, dtype=ACT, device=device))


class Layer:
    def __init__(self, batch, T, L, shape, gen, device):
        HV, H, K, V = shape
        self.A_log = torch.rand(HV, generator=gen, device=device) * math.log(16.0)
        self.dt_bias = torch.rand(HV, generator=gen, device=device) - 4.0
        self.slots = torch.arange(batch, dtype=torch.int32, device=device)
        self.cache = GdnReplayCache.allocate(batch, HV, H, K, V, ring_len=L, device=device)
        self.cache.checkpoint.copy_(torch.randn(self.cache.checkpoint.shape, generator=gen, device=device) * 0.1)
        # Baseline: token k of row r steps the state in slot k * batch + r.
        self.pool = torch.randn(T * batch, HV, V, K, generator=gen, device=device) * 0.1
        self.pos_slots = [self.slots + k * batch for k in range(T)]


def verify_step(layer, tok, acc, T):
    replayssm.gdn_replay_verify(layer.cache, tok["q"], tok["k"], tok["v"], tok["a"], tok["b"], layer.A_log,
                                slot_ids=layer.slots, dt_bias=layer.dt_bias, out=tok["out"])
    replayssm.mamba2_replay_commit(layer.cache, layer.slots, acc)


def baseline_step(layer, tok, acc, T):
    for k in range(T):
        replayssm.gdn_step(layer.pool, tok["q"][:, k], tok["k"][:, k], tok["v"][:, k], tok["a"][:, k], tok["b"][:, k],
                           layer.A_log, slot_ids=layer.pos_slots[k], dt_bias=layer.dt_bias, out=tok["out"][:, k])


def analytic_bytes(batch, T, L, accs, shape, passes=4, act_bytes=2, state_bytes=4):
    """Average bytes per step: verify+commit (following the cursors through `passes` replays of the step
    sequence from empty rings, averaging the last: the steady state the timing sees) and the baseline."""
    HV, H, K, V = shape
    state = HV * V * K * state_bytes
    ring_token = HV * V * 4 + H * K * 4 + HV * 4  # u, k, g (fp32)
    io_token = 2 * H * K * act_bytes + 2 * HV * V * act_bytes + 2 * HV * act_bytes  # q, k; v, out; a, b
    cur = torch.zeros(batch, dtype=torch.int64)
    for _ in range(passes):
        verify = 0.0
        for acc in accs:
            fold = cur + T > L
            verify += batch * (state + T * io_token + T * ring_token) + float(cur.sum()) * ring_token
            verify += float(fold.sum()) * state
            cur = torch.where(fold, torch.zeros_like(cur), cur) + acc.cpu().long()
    baseline = batch * T * (2 * state + io_token)
    return {"verify": verify / len(accs), "baseline": baseline}


def bench(batch, T, rate, L, steps, shape, gen, smoke=False, tune=False) -> dict:
    device = "cpu" if smoke else "cuda"
    HV, H, K, V = shape
    state_layer = batch * HV * V * K * 4
    n_layers = 1 if smoke else max(2, math.ceil(4 * common.l2_bytes() / state_layer))
    layers = [Layer(batch, T, L, shape, gen, device) for _ in range(n_layers)]
    toks = [[window(batch, T, shape, gen, device) for _ in layers] for _ in range(steps)]
    accs = [[accepted_counts(batch, T, rate, gen, device) for _ in layers] for _ in range(steps)]
    nbytes = analytic_bytes(batch, T, L, [a[0] for a in accs], shape)

    def run(fn):
        def cycle():
            for step_toks, step_accs in zip(toks, accs):
                for layer, tok, acc in zip(layers, step_toks, step_accs):
                    fn(layer, tok, acc, T)
        return cycle

    if smoke:
        run(verify_step)()
        run(baseline_step)()
        return {"batch": batch, "T": T, "rate": rate, "bytes": nbytes}
    r = {"batch": batch, "T": T, "rate": rate, "ring_len": L, "steps": steps, "layers_rotated": n_layers, "bytes": nbytes}
    r["verify_us"] = common.time_graph(run(verify_step)) / (steps * n_layers)
    r["baseline_us"] = common.time_graph(run(baseline_step)) / (steps * n_layers)
    r["speedup"] = r["baseline_us"] / r["verify_us"]
    for setting in VERIFY_TUNES if tune else []:
        os.environ["REPLAYSSM_TUNE"] = setting
        try:
            r.setdefault("verify_tuning_us", {})[setting] = common.time_graph(run(verify_step)) / (steps * n_layers)
        finally:
            del os.environ["REPLAYSSM_TUNE"]
    return r


def replay_step_us(batch, L, shape, gen) -> float:
    """One gdn_replay_step at this batch (µs per step and layer), timed as in bench_gdn.py."""
    import bench_gdn as bg
    return bg.bench_batch(batch, L, shape, None, gen)["replay_us"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 128, 256])
    parser.add_argument("--T", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--rates", type=float, nargs="+", default=[0.25, 0.5, 0.75, 1.0])
    parser.add_argument("--ring-len", type=int, default=32)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--tune", action="store_true", help="also time the alternative verify kernels")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "gdn_speculative.json"))
    args = parser.parse_args()
    if args.smoke:
        gen = torch.Generator().manual_seed(0)
        for T in (2, 4):
            print(bench(3, T, 0.5, 8, 5, (4, 2, 16, 8), gen, smoke=True))
        return
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (32, 16, 128, 128)  # HV, H, K, V
    bw = common.measure_bandwidth()
    rows = []
    for batch in args.batches:
        one_step = replay_step_us(batch, 16, shape, gen)
        for T in args.T:
            for rate in args.rates:
                r = bench(batch, T, rate, args.ring_len, args.steps, shape, gen, tune=args.tune)
                r["replay_step_us"] = one_step
                r["verify_over_replay_step"] = r["verify_us"] / one_step
                r["verify_floor_us"] = r["bytes"]["verify"] / (max(bw["read_TBps"], bw["copy_TBps"]) * 1e6)
                r["baseline_floor_us"] = r["bytes"]["baseline"] / (bw["copy_TBps"] * 1e6)
                rows.append(r)
                print(r, flush=True)
    common.write_result(args.out, {"bandwidth": bw, "shape": dict(zip(("HV", "H", "K", "V"), shape)),
                                   "state_dtype": "float32", "act_dtype": "bfloat16", "rows": rows})
    print(f"\n{'batch':>5} {'T':>2} {'rate':>5} {'baseline':>9} {'verify':>8} {'floor':>7} {'speedup':>8} {'/replay':>8}")
    for r in rows:
        print(f"{r['batch']:>5} {r['T']:>2} {r['rate']:>5.2f} {r['baseline_us']:>9.1f} {r['verify_us']:>8.1f} "
              f"{r['verify_floor_us']:>7.1f} {r['speedup']:>7.2f}x {r['verify_over_replay_step']:>7.2f}x  "
              + " ".join(f"{k}: {v:.1f}" for k, v in r.get("verify_tuning_us", {}).items()))


if __name__ == "__main__":
    main()
