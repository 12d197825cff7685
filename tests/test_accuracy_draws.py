"""The accuracy study's decay draws (bench/accuracy/accuracy.py, --decays): what each claims to draw."""
import math

import torch

from helpers import load_script


def test_trained_draw_gives_most_decays_near_one_and_a_few_fast_heads():
    """--decays trained: |A| softplus(dt_bias) (the per-token decay rate at a zero dt input) is in [1e-4, 1e-2] for about 7
    heads in 8 and in [0.1, 1] for the rest, whatever |A| is; --decays init spreads the rates over [1e-3, 1.6]."""
    study = load_script("bench", "accuracy", "accuracy.py")
    n = 20000
    gen = torch.Generator().manual_seed(torch.randint(0, 2**31 - 1, ()).item())
    A_abs = torch.exp(torch.empty(n).uniform_(0.0, math.log(16.0), generator=gen))
    rate = A_abs * torch.nn.functional.softplus(study.trained_dt_bias(A_abs, gen))
    slow = (rate >= 1e-4 * (1 - 1e-4)) & (rate <= 1e-2 * (1 + 1e-4))
    fast = (rate >= 0.1 * (1 - 1e-4)) & (rate <= 1.0 + 1e-4)
    assert bool((slow | fast).all())
    # 1/8 fast: a binomial share over 20000 heads has a standard deviation of 0.0023
    assert abs(fast.float().mean().item() - 1 / 8) < 0.012
    init_rate = A_abs * torch.nn.functional.softplus(study.log_uniform_dt_bias(n, gen))
    assert (init_rate < 0.1).float().mean().item() < 0.8  # the init draw is not "most decays near 1"
    # (|A| in [1, 16] times dt in [1e-3, 1e-1]; the bounds' ends reached within a few percent by 20000 draws)
    assert init_rate.min().item() >= 1e-3 * (1 - 1e-4) and init_rate.max().item() <= 1.6 * (1 + 1e-4)
    assert init_rate.min().item() < 1.5e-3 and init_rate.max().item() > 1.2
