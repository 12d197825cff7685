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
                                          [--ring-len 12 ...] [--tune] [--out bench/results/gdn_speculative.json]
    python bench/bench_gdn_speculative.py --smoke    # tiny shapes, eager, CPU: checks the code paths only
"""
from __future__ import annotations

import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_speculative as spec  # noqa: E402

import replayssm  # noqa: E402
from replayssm import GdnReplayCache  # noqa: E402

ACT = torch.bfloat16


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


def analytic_bytes(batch, T, L, accs, shape, act_bytes=2, state_bytes=4):
    HV, H, K, V = shape
    return spec.window_bytes(batch, T, L, accs, state=HV * V * K * state_bytes,
                             ring_token=HV * V * 4 + H * K * 4 + HV * 4,  # u, k, g (fp32)
                             io_token=2 * H * K * act_bytes + 2 * HV * V * act_bytes + 2 * HV * act_bytes)  # q, k; v, out; a, b


def replay_step_us(batch, L, shape, gen) -> float:
    """One gdn_replay_step at this batch (µs per step and layer), timed as in bench_gdn.py."""
    import bench_gdn as bg
    return bg.bench_batch(batch, L, shape, None, gen)["replay_us"]


# --tune: rows per block (the default: a key head's 256 at large batch), and the row loop's dots on the CUDA cores
# (gdn_verify_mma=0; the default puts them on tensor cores), csrc/gdn/kernels.cuh.
# gdn_verify_4bps=0: three blocks an SM (the default before session 31). gdn_verify_rows=256 (a key head's rows: the
# default from batch ~64 up) at batch 32: one wave of 512 blocks where the ~2-waves rule gives 1024 of 128 rows.
TUNES = ["gdn_verify_rows=256", "gdn_verify_rows=128", "gdn_verify_rows=64", "gdn_verify_mma=0", "gdn_verify_4bps=0"]
GDN = spec.Kind("gdn", (32, 16, 128, 128), (4, 2, 16, 8), lambda s: s[0] * s[2] * s[3] * 4, Layer, window, verify_step,
                baseline_step, analytic_bytes, replay_step_us, TUNES, "gdn_speculative.json", ring_len=12)

if __name__ == "__main__":
    spec.main(GDN)
