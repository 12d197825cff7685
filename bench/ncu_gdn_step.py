"""The GDN standard step beside fla's fused recurrent kernel, for Nsight Compute (issue 4: why does gdn_step run at
~89% of the copy bandwidth where fla's kernel, on the same state layout and bytes, runs at ~98%?). Runs each kernel
twice on the same inputs at one batch size (HV=32, H=16, K=V=128, FP32 state [batch, HV, V, K], bf16 activations);
REPLAYSSM_TUNE may pick gdn_step's configuration.

    ncu --section SpeedOfLight --section MemoryWorkloadAnalysis -k regex:"fused_recurrent|gdn_step" \\
        python bench/ncu_gdn_step.py [--batch 256]
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_gdn as bg  # noqa: E402

import replayssm  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()
    fla = bg.load_fla()
    if fla is None:
        raise SystemExit("fla is needed: run third_party/get_baselines.sh")
    HV, H, K, V = 32, 16, 128, 128
    gen = torch.Generator(device="cuda").manual_seed(0)
    t = bg.make_inputs(args.batch, 1, 1, (HV, H, K, V), gen, "cuda")[0][0]
    A_log = torch.rand(HV, device="cuda") * math.log(16.0)
    dt_bias = torch.rand(HV, device="cuda") - 4.0
    slots = torch.arange(args.batch, dtype=torch.int32, device="cuda")
    pool = torch.randn(args.batch, HV, V, K, device="cuda") * 0.1
    for _ in range(2):
        fla(t["q"][:, None], t["k"][:, None], t["v"][:, None], g=t["a"][:, None], beta=t["b"][:, None],
            initial_state=pool, output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
            A_log=A_log, dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True, state_v_first=True)
    for _ in range(2):
        replayssm.gdn_step(pool, t["q"], t["k"], t["v"], t["a"], t["b"], A_log, slot_ids=slots, dt_bias=dt_bias, out=t["out"])
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
