"""Accuracy study (issue 5, Mamba-2 part): how the state's storage precision and the fold schedule reach the
outputs and the state over a long horizon, against a float64 sequential reference.

One Mamba-2 layer at the Nemotron-H 8B shape (H=128, P=64, N=128, G=8), batch 1, realistic parameters (dt
log-uniform in [1e-3, 1e-1], A = -exp(U(0, log 16)): most decays near 1, a few fast heads), inputs drawn in
bf16 and fed as fp32 so that the output error shows the state's precision, not the activation rounding.
Modes: standard step with fp32 / bf16 state (rounded every token); replay with fp32 checkpoint; replay with
bf16 checkpoint storage, rounded to nearest once per fold (L=16). Stochastic rounding at the fold and the bf16
output view are not implemented yet (the rest of issue 5).

    python bench/accuracy/mamba2_accuracy.py [--tokens 8192] [--device cpu|cuda]
writes bench/accuracy/mamba2_accuracy.json and, when matplotlib is installed, mamba2_accuracy.png.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch

import replayssm
from replayssm import Mamba2ReplayCache
from replayssm import reference as R

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=128)
    ap.add_argument("--ring-len", type=int, default=16)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=os.path.join(HERE, "mamba2_accuracy.json"))
    args = ap.parse_args()
    dev, H, P, N, G, L = args.device, args.heads, 64, 128, 8, args.ring_len
    gen = torch.Generator().manual_seed(0)
    A = (-torch.exp(torch.empty(H).uniform_(0.0, math.log(16.0), generator=gen)))
    dt0 = torch.exp(torch.empty(H).uniform_(math.log(1e-3), math.log(1e-1), generator=gen))
    dt_bias = dt0 + torch.log(-torch.expm1(-dt0))
    D = torch.randn(H, generator=gen)
    kw = dict(D=D.to(dev), dt_bias=dt_bias.to(dev), dt_softplus=True)
    A_dev = A.to(dev)
    ids = torch.zeros(1, dtype=torch.int32, device=dev)

    modes = {
        "standard_fp32_state": ("standard", torch.float32),
        "standard_bf16_state": ("standard", torch.bfloat16),
        "replay_fp32_checkpoint": ("replay", torch.float32),
        "replay_bf16_checkpoint_nearest": ("replay", torch.bfloat16),
    }
    pools = {m: torch.zeros(1, H, P, N, dtype=dt_, device=dev) for m, (kind, dt_) in modes.items() if kind == "standard"}
    caches = {m: Mamba2ReplayCache.allocate(1, H, P, G, N, ring_len=L, act_dtype=torch.float32, checkpoint_dtype=dt_,
                                            device=dev) for m, (kind, dt_) in modes.items() if kind == "replay"}
    ref = torch.zeros(1, H, P, N, dtype=torch.float64)
    checkpoints = sorted({16, 256, 2048, args.tokens} & set(range(1, args.tokens + 1)))
    out_err = {m: [] for m in modes}
    state_err = {m: {} for m in modes}
    t0 = time.time()
    for t in range(1, args.tokens + 1):
        rnd = lambda *s, scale=1.0: (torch.randn(*s, generator=gen) * scale).to(torch.bfloat16).float()
        x, dt, B, C, z = rnd(1, H, P), rnd(1, H, scale=0.5), rnd(1, G, N), rnd(1, G, N), rnd(1, H, P)
        y_ref, ref = R.mamba2_step(ref, x, R.process_dt(dt, dt_bias, True), A, B, C, D, z)
        xd, dtd, Bd, Cd, zd = (v.to(dev) for v in (x, dt, B, C, z))
        for m, (kind, _) in modes.items():
            if kind == "standard":
                y = replayssm.mamba2_step(pools[m], xd, dtd, A_dev, Bd, Cd, z=zd, slot_ids=ids, **kw)
            else:
                y = replayssm.mamba2_replay_step(caches[m], xd, dtd, A_dev, Bd, Cd, z=zd, slot_ids=ids, **kw)
            out_err[m].append(((y.double().cpu() - y_ref).norm() / y_ref.norm()).item())
        if t in checkpoints:
            for m, (kind, _) in modes.items():
                S = pools[m] if kind == "standard" else replayssm.mamba2_replay_state(caches[m], A_dev, ids)
                state_err[m][t] = ((S.double().cpu() - ref).norm() / ref.norm()).item()
            print(f"token {t}: " + ", ".join(f"{m} out {out_err[m][-1]:.2e} state {state_err[m][t]:.2e}" for m in modes),
                  f"({time.time() - t0:.0f} s)", flush=True)

    def window_mean(errs, t, half=8):  # output error near token t (mean over a small window)
        lo, hi = max(0, t - half), min(len(errs), t + half)
        return sum(errs[lo:hi]) / (hi - lo)

    table = {m: {str(t): {"output": window_mean(out_err[m], t - 1), "state": state_err[m][t]} for t in checkpoints}
             for m in modes}
    result = dict(shape=dict(H=H, P=P, N=N, G=G, batch=1), ring_len=L, tokens=args.tokens, device=dev,
                  activations="fp32 carrying bf16-valued inputs", table=table,
                  output_error_per_token={m: out_err[m] for m in modes},
                  command=" ".join(["python"] + sys.argv), torch=torch.__version__)
    with open(args.out, "w") as f:
        json.dump(result, f)
    print(f"\n{'mode':34s}" + "".join(f"{'out@' + str(t):>11s}{'state@' + str(t):>13s}" for t in checkpoints))
    for m in modes:
        print(f"{m:34s}" + "".join(f"{table[m][str(t)]['output']:>11.2e}{table[m][str(t)]['state']:>13.2e}" for t in checkpoints))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for m in modes:
        ax.plot(range(1, args.tokens + 1), out_err[m], label=m, linewidth=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("token")
    ax.set_ylabel("||y - y_ref|| / ||y_ref||")
    ax.set_title(f"Mamba-2 H={H} P={P} N={N}: output error vs float64 reference (L={L})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out.replace(".json", ".png"), dpi=120)
    print("wrote", args.out, args.out.replace(".json", ".png"))


if __name__ == "__main__":
    main()
