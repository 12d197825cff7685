"""bench/targets.py reads the issues' targets out of the benchmarks' JSONs: each bound on the right side, rows it has
no batch for left out, the file's kind told by its contents (CPU; the benchmarks' JSON layout)."""
import json
import os
import random

from helpers import load_script

HERE = os.path.dirname(__file__)


def test_decode_targets_are_judged_against_their_bounds():
    mod = load_script("bench", "targets.py")
    rng = random.Random()
    under, over = rng.uniform(1.0, 1.74), rng.uniform(1.76, 2.5)
    doc = {"environment": {"device": "NVIDIA H200", "commit": "abc1234"}, "rows": [
        {"batch": 128, "mamba_ssm_us": 300.0, "standard_us": 280.0, "replay_us": 280.0 / under,
         "replay_vs_standard": under, "standard_frac_copy_bw": 0.905},
        {"batch": 256, "mamba_ssm_us": 500.0, "standard_us": 510.0, "replay_us": 510.0 / over,
         "replay_vs_standard": over, "replay_over_floor": 1.13, "replay_view_over_floor": 1.149},
    ]}
    got = {what: ok for _, what, _, ok in mod.targets(doc)}
    assert got["mamba2: replay / step >= 1.75x, batch 128"] is False
    assert got["mamba2: replay / step >= 1.75x, batch 256"] is True
    assert got["mamba2: `mamba2_step` fraction of copy bandwidth >= 90%, batch 128"] is True
    assert got["mamba2: replay over its floor <= 1.12x, batch 256"] is False  # (an upper bound)
    assert got["mamba2: bf16 view over its floor <= 1.15x, batch 256"] is True
    assert got["mamba2: standard faster than mamba_ssm's SSU, batch 128"] is True
    assert got["mamba2: standard faster than mamba_ssm's SSU, batch 256"] is False
    assert not any("batch 32" in what or "batch 1," in what for what in got)  # (no such rows: left out)
    assert mod.card(doc) == "NVIDIA H200 @ abc1234"


def test_verify_and_ncu_targets():
    mod = load_script("bench", "targets.py")
    rows = [{"batch": 256, "T": 4, "rate": r, "ring_len": 16, "verify_us": 1.0, "speedup": s, "verify_over_replay_step": v}
            for r, s, v in ((0.5, 4.2, 1.29), (1.0, 3.9, 1.31))] + [
           {"batch": 128, "T": 4, "rate": 0.5, "verify_us": 1.0, "speedup": 9.0, "verify_over_replay_step": 9.0}]
    got = [(issue, ok) for issue, _, _, ok in mod.targets({"layer": "gdn", "rows": rows})]
    assert got == [(4, True), (4, True), (4, False), (4, False)]  # (batch 128 left out)
    ncu = {"batch": 256, "metrics": "dram", "mamba2": {"replay": {"measured_over_analytic": 0.95}},
           "gdn": {"replay_view": {"measured_over_analytic": 1.11}}}
    assert [(issue, ok) for issue, _, _, ok in mod.targets(ncu)] == [(2, True), (4, False)]


def test_a_committed_h200_run():
    mod = load_script("bench", "targets.py")
    path = os.path.join(HERE, "..", "bench", "results", "session32", "mamba2_tune_call2_h200.json")
    with open(path) as f:
        got = {what: (value, ok) for _, what, value, ok in mod.targets(json.load(f))}
    assert got["mamba2: replay / step >= 1.75x, batch 256"] == ("1.839x", True)
    assert got["mamba2: bf16 view / step >= 2.8x, batch 256"] == ("2.774x", False)
