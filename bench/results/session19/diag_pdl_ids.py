# The diagnostic of session 19's call 3 (bench/results/session19/README.md): why test_cuda_pdl_switch_takes_only_0_or_1
# failed now and then. 400 trials per case of that test's body (before 50592af: dt ~ N(0, 1) with the default dt limit,
# which clamps dt at 0), PDL off and on, the slot ids made by a copy, by a fill kernel, or followed by a synchronize.
# Printed on the H200 (f92867b): 21-29 of 400 bad in each of the six cases, i.e. the draw (all 4 heads dt <= 0: 1 in
# 16), not a race. Run from the repository root with the extension built: python3 bench/results/session19/diag_pdl_ids.py
import os

import torch

import replayssm


def trial(mode):
    state = torch.zeros(2, 4, 8, 32, device="cuda")
    x, B = torch.randn(1, 4, 8, device="cuda"), torch.randn(1, 2, 32, device="cuda")
    dt, A = torch.randn(1, 4, device="cuda"), -torch.ones(4, device="cuda")
    if mode == "fill":
        ids = torch.full((1,), 1, dtype=torch.int32, device="cuda")
    else:
        ids = torch.tensor([1], dtype=torch.int32, device="cuda")
    if mode == "sync":
        torch.cuda.synchronize()
    out = replayssm.mamba2_step(state, x, dt, A, B, B, slot_ids=ids)
    torch.cuda.synchronize()
    return bool(state[1].abs().sum() > 0 and out.abs().sum() > 0 and not state[0].any())


for pdl in ("0", "1"):
    os.environ["REPLAYSSM_PDL"] = pdl
    for mode in ("copy", "sync", "fill"):
        bad = sum(not trial(mode) for _ in range(400))
        print(f"PDL={pdl} ids by {mode:5s}: {bad}/400 bad", flush=True)
