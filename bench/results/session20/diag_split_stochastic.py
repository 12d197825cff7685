"""Diagnostic for the one failure of session 20's memcheck run:
test_cuda_numerical_split_matches_cpu[replay_prefetch=0,replay_rows=48-stochastic-128-torch.float32].
Repeats that test's body (tests/test_numerics.py: split_matches_cpu) on fresh seeds and reports, per trial, each of
its checks' quantities instead of asserting, so that a failing trial shows which check failed and by how much.
Run from the repository root with the extension built: python3 bench/results/session20/diag_split_stochastic.py"""
import os
import sys

import torch

sys.path.insert(0, "tests")
import replayssm  # noqa: E402
from replayssm import Mamba2ReplayCache  # noqa: E402
from helpers import Layer, rel_err  # noqa: E402
from test_numerics import make_gen, ulp  # noqa: E402


def trial(N, act_dtype, H=8, P=32, G=2):
    seed = torch.randint(0, 2**31 - 1, ()).item()
    L, steps = 4, 13
    kw = dict(checkpoint_dtype=torch.bfloat16, rounding="stochastic", seed=11)
    init = torch.randn(2, H, P, N, generator=make_gen())
    caches, outs, history = {}, {}, []
    for key, device in (("cpu", "cpu"), ("cuda", "cuda"), ("cuda again", "cuda")):
        layer = Layer(H, P, G, N, device, torch.Generator().manual_seed(seed))
        cache = Mamba2ReplayCache.allocate(2, H, P, G, N, ring_len=L, act_dtype=act_dtype, device=device, **kw)
        cache.reset(torch.tensor([0, 1], device=device), init.to(device))
        gen = torch.Generator().manual_seed(seed)
        ids = torch.tensor([1, 0], dtype=torch.int32, device=device)
        y = []
        for _ in range(steps):
            tok = layer.token(2, act_dtype, gen)
            y.append(replayssm.mamba2_replay_step(cache, tok["x"], tok["dt"], layer.A, tok["B"], tok["C"], z=tok["z"],
                                                  slot_ids=ids, **layer.kwargs()).cpu())
            if key == "cpu":
                history.append(cache.checkpoint.float().abs())
        caches[key], outs[key] = cache, torch.stack(y)
    cpu, gpu, again = caches["cpu"], caches["cuda"], caches["cuda again"]
    same = gpu.checkpoint.cpu() == cpu.checkpoint
    diff = (gpu.checkpoint.cpu().float() - cpu.checkpoint.float()).abs()
    scale = torch.maximum(init.abs(), cpu.checkpoint.float().abs())
    ratio = (diff[~same] / ulp(scale[~same], torch.bfloat16)).max().item() if (~same).any() else 0.0
    # The test's scale since the fix: the element's largest magnitude over its history (every step's checkpoint).
    hscale = torch.stack([init.abs()] + history).amax(0)
    hratio = (diff[~same] / ulp(hscale[~same], torch.bfloat16)).max().item() if (~same).any() else 0.0
    return dict(seed=seed, reproducible=bool(torch.equal(outs["cuda"], outs["cuda again"])
                                              and torch.equal(gpu.checkpoint, again.checkpoint)),
                folds=(gpu.fold_count.tolist() if gpu.fold_count is not None else None, cpu.fold_count.tolist()),
                out_err=rel_err(outs["cuda"], outs["cpu"].double()), same_frac=same.float().mean().item(),
                n_diff=int((~same).sum()), max_diff_in_ulps=ratio, max_diff_in_history_ulps=hratio)


if __name__ == "__main__":
    trials = int(os.environ.get("TRIALS", 100))
    for tune in ("replay_prefetch=0,replay_rows=48", ""):
        os.environ["REPLAYSSM_TUNE"] = tune
        bad = old_bad = 0
        worst = dict(out_err=0.0, same_frac=1.0, max_diff_in_ulps=0.0)
        for i in range(trials):
            r = trial(128, torch.float32)
            old = r["max_diff_in_ulps"] > 13 // 4 + 0.01  # the check before the fix (initial / final magnitude)
            fail = (not r["reproducible"] or r["out_err"] >= 1e-3 or r["same_frac"] <= 0.99
                    or r["max_diff_in_history_ulps"] > 13 // 4 + 0.01)
            old_bad += old
            worst = dict(out_err=max(worst["out_err"], r["out_err"]), same_frac=min(worst["same_frac"], r["same_frac"]),
                         max_diff_in_ulps=max(worst["max_diff_in_ulps"], r["max_diff_in_ulps"]),
                         max_diff_in_history_ulps=max(worst.get("max_diff_in_history_ulps", 0.0),
                                                      r["max_diff_in_history_ulps"]))
            if fail:
                bad += 1
                print(f"tune={tune!r} trial {i}: FAIL {r}", flush=True)
        print(f"tune={tune!r}: {bad} of {trials} trials fail the test's checks ({old_bad} the check before the fix);"
              f" worst {worst}", flush=True)
