"""Command line: `python -m replayssm demo` decodes a few hundred tokens through one Mamba-2 layer in standard
and replay modes, on the GPU when there is one, and reports whether they agree (with each other and with the
float64 reference), how often the checkpoint was written, and the time per token of each."""
from __future__ import annotations

import argparse
import math
import time

import torch

import replayssm
from replayssm import Mamba2ReplayCache
from replayssm import reference as R


def _timer(device):
    if device.type == "cuda":
        def measure(fn):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e3
    else:
        def measure(fn):
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e6
    return measure


def demo(args) -> int:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() and replayssm.cuda_built() else "cpu"))
    on_gpu = device.type == "cuda"
    # Nemotron-H 8B's Mamba-2 layer shape on the GPU; a quarter of its heads on the CPU.
    H, P, N, G = (128, 64, 128, 8) if on_gpu else (32, 64, 128, 2)
    batch = args.batch or (32 if on_gpu else 2)
    L, T = args.ring_len, args.tokens
    act = torch.bfloat16
    gen = torch.Generator().manual_seed(0)
    A = (-torch.exp(torch.empty(H).uniform_(0.0, math.log(16.0), generator=gen))).to(device)
    dt0 = torch.exp(torch.empty(H).uniform_(math.log(1e-3), math.log(1e-1), generator=gen))
    dt_bias = (dt0 + torch.log(-torch.expm1(-dt0))).to(device)
    D = torch.randn(H, generator=gen).to(device)
    kw = dict(D=D, dt_bias=dt_bias, dt_softplus=True)

    slots = torch.arange(batch, dtype=torch.int32, device=device)
    init = (torch.randn(batch, H, P, N, generator=gen) * 0.1).to(device)
    state = init.clone()
    cache = Mamba2ReplayCache.allocate(batch, H, P, G, N, ring_len=L, act_dtype=act, device=device)
    cache.reset(slots, init)
    ref = init.double()
    measure = _timer(device)
    t_std = t_rep = 0.0
    worst_std = worst_rep = worst_pair = 0.0
    ckpt_writes = 0
    for t in range(T):
        def rnd(*shape, scale=1.0):
            return (torch.randn(*shape, generator=gen) * scale).to(device, act)
        x, dt, B, C, z = rnd(batch, H, P), rnd(batch, H, scale=0.5), rnd(batch, G, N), rnd(batch, G, N), rnd(batch, H, P)
        y_std, y_rep = torch.empty_like(x), torch.empty_like(x)
        before = cache.checkpoint.clone()
        t_std += measure(lambda: replayssm.mamba2_step(state, x, dt, A, B, C, z=z, slot_ids=slots, out=y_std, **kw))
        t_rep += measure(lambda: replayssm.mamba2_replay_step(cache, x, dt, A, B, C, z=z, slot_ids=slots, out=y_rep, **kw))
        ckpt_writes += int(not torch.equal(before, cache.checkpoint))
        y_ref, ref = R.mamba2_step(ref, x, R.process_dt(dt, dt_bias, True), A, B, C, D, z)
        def err(a, b):
            return ((a.double() - b.double()).norm() / b.double().norm()).item()
        worst_std, worst_rep = max(worst_std, err(y_std, y_ref)), max(worst_rep, err(y_rep, y_ref))
        worst_pair = max(worst_pair, err(y_rep, y_std))

    bound = 2 * 2.0**-8 + 1e-4  # outputs are rounded once to bf16 (unit roundoff 2^-8)
    agree = max(worst_std, worst_rep, worst_pair) < bound
    print(f"replayssm demo: Mamba-2 layer H={H} P={P} N={N} G={G}, batch {batch}, {T} tokens, ring {L}, "
          f"fp32 state, bf16 activations, on {device}")
    print(f"  outputs agree: {'yes' if agree else 'NO'} (worst ||y - y_ref|| / ||y_ref|| over tokens: standard "
          f"{worst_std:.2e}, replay {worst_rep:.2e}, replay vs standard {worst_pair:.2e}; bound {bound:.1e})")
    print(f"  checkpoint written {ckpt_writes} times in {T} tokens (once every {L}; the standard step writes its "
          f"state every token: {T} times)")
    print(f"  time per token: standard {t_std / T:.1f} us, replay {t_rep / T:.1f} us "
          f"(eager, one layer, {'CUDA events' if on_gpu else 'wall clock'}; bench/ has the serving-style timings)")
    return 0 if agree and ckpt_writes == T // L else 1


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m replayssm")
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="standard vs replay decoding of one Mamba-2 layer")
    d.add_argument("--tokens", type=int, default=256)
    d.add_argument("--batch", type=int, default=None)
    d.add_argument("--ring-len", type=int, default=16)
    d.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    args = parser.parse_args()
    return demo(args)


if __name__ == "__main__":
    raise SystemExit(main())
