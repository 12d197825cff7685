"""The GDN verify's accuracy over a long run, per row loop: speculative decoding with every window accepted
(gdn_replay_verify + mamba2_replay_commit, T tokens a step, early folds at their rate), the committed state
(gdn_replay_state) and the outputs against the float64 delta rule, at tokens 16 .. 8192. Run once per
REPLAYSSM_TUNE setting, so that the tensor-core row loop (3xTF32 dots, whose sums S k feed the corrections u and so
the history) is compared with the CUDA-core one (gdn_verify_mma=0) on the same inputs. Parameters as trained layers
have them (most decays near 1, a few fast heads: tests/test_gdn.py's GdnLayer draw), fp32 checkpoint, bf16
activations, one key head's worth of value heads by default.

    python bench/accuracy/gdn_verify_long.py [--tokens 8192] [--T 4] [--ring-len 12] [--tunes "" gdn_verify_mma=0]

CUDA when present (the question is the CUDA kernels'); on the CPU it runs the CPU implementation (a smoke test).
"""
from __future__ import annotations

import argparse
import json
import math
import os

import torch

import replayssm
from replayssm import GdnReplayCache
from replayssm import reference as R


def run(tune, args, device):
    os.environ["REPLAYSSM_TUNE"] = tune
    gen = torch.Generator().manual_seed(args.seed)
    HV, H, K, V, T, L = args.HV, args.H, args.K, args.V, args.T, args.ring_len
    A_log = torch.empty(HV).uniform_(0.0, math.log(16.0), generator=gen)
    dt0 = torch.exp(torch.empty(HV).uniform_(math.log(1e-3), math.log(1e-1), generator=gen))
    dt_bias = dt0 + torch.log(-torch.expm1(-dt0))
    cache = GdnReplayCache.allocate(1, HV, H, K, V, ring_len=L, device=device)
    init = torch.randn(1, HV, V, K, generator=gen) * 0.1
    cache.checkpoint.copy_(init.to(device))
    ref = init.double().to(device)
    ids = torch.zeros(1, dtype=torch.int32, device=device)
    accept = torch.full((1,), T, dtype=torch.int32, device=device)
    marks = {16, 64, 256, 1024, 2048, 4096, 8192, args.tokens}
    rows, out_err, done = [], [], 0
    while done < args.tokens:
        rnd = lambda *s: torch.randn(1, T, *s, generator=gen)
        tok = dict(q=rnd(H, K), k=rnd(H, K), v=rnd(HV, V), a=rnd(HV), b=rnd(HV))
        dev = {k: v.to(device, torch.bfloat16) for k, v in tok.items()}
        out = replayssm.gdn_replay_verify(cache, **dev, A_log=A_log.to(device), dt_bias=dt_bias.to(device), slot_ids=ids)
        replayssm.mamba2_replay_commit(cache, ids, accept)
        q, k, g, beta = R.gdn_prepare(*(dev[n].cpu() for n in ("q", "k", "a", "b")), A_log, dt_bias)
        for t in range(T):
            o, ref = R.gdn_step(ref, q[:, t].to(device), k[:, t].to(device), dev["v"][:, t].double(), g[:, t].to(device),
                                beta[:, t].to(device))
            out_err.append(float((out[:, t].double() - o).norm() / o.norm()))
        done += T
        if done in marks or any(done - T < m <= done for m in marks):
            state = replayssm.gdn_replay_state(cache, ids).double()
            rows.append(dict(token=done, state=float((state - ref).norm() / ref.norm()),
                             state_head_median=float(((state - ref).flatten(2).norm(dim=2) / ref.flatten(2).norm(dim=2)).median()),
                             output=sum(out_err[-16:]) / len(out_err[-16:])))
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--T", type=int, default=4)
    parser.add_argument("--ring-len", type=int, default=12)
    parser.add_argument("--HV", type=int, default=2)
    parser.add_argument("--H", type=int, default=1)
    parser.add_argument("--K", type=int, default=128)
    parser.add_argument("--V", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tunes", nargs="+", default=["", "gdn_verify_mma=0"])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    result = {"args": vars(args), "device": device, "runs": {}}
    for tune in args.tunes:
        rows = run(tune, args, device)
        result["runs"][tune or "default"] = rows
        print(f"REPLAYSSM_TUNE={tune!r} ({device})")
        for r in rows:
            print(f"  token {r['token']:5d}: state {r['state']:.2e} (median head {r['state_head_median']:.2e}), output {r['output']:.2e}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
