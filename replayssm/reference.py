"""Float64 PyTorch references of ../shared/docs/MATH.md: the tests' oracle. Slow and plain on purpose.

All functions take batched rows (no slot pools): state (b, H, P, N), x (b, H, P), dt (b, H), B/C (b, G, N).
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

f64 = torch.float64


def process_dt(dt: torch.Tensor, dt_bias: Optional[torch.Tensor], dt_softplus: bool,
               dt_limit: Tuple[float, float] = (0.0, math.inf)) -> torch.Tensor:
    """dt as the recurrence uses it: clamp(softplus(dt + bias) or dt + bias, *dt_limit), float64."""
    dt = dt.to(f64)
    if dt_bias is not None:
        dt = dt + dt_bias.to(f64)
    if dt_softplus:
        dt = F.softplus(dt)
    return dt.clamp(min=dt_limit[0], max=dt_limit[1])


def _heads(t: torch.Tensor, nheads: int) -> torch.Tensor:
    """(b, G, N) per group -> (b, H, N) per head (head h uses group h // (H/G))."""
    return t.repeat_interleave(nheads // t.shape[1], dim=1)


def _output(y: torch.Tensor, x: torch.Tensor, D: Optional[torch.Tensor], z: Optional[torch.Tensor]) -> torch.Tensor:
    if D is not None:
        y = y + D.to(f64)[:, None] * x.to(f64)
    if z is not None:
        y = y * F.silu(z.to(f64))
    return y


def mamba2_step(state: torch.Tensor, x, dt_processed, A, B, C, D=None, z=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """One standard step. Returns (y, new_state) in float64; state is not modified.
    S_t = exp(dt A) S + dt x (x) B ;  y = S_t C + D x, gated by silu(z)."""
    H = x.shape[1]
    dt = dt_processed.to(f64)
    decay = torch.exp(dt * A.to(f64))  # (b, H)
    Bh, Ch = _heads(B.to(f64), H), _heads(C.to(f64), H)
    new = decay[..., None, None] * state.to(f64) + (dt[..., None] * x.to(f64))[..., None] * Bh[:, :, None, :]
    y = torch.einsum("bhpn,bhn->bhp", new, Ch)
    return _output(y, x, D, z), new


def mamba2_replay(checkpoint, ring_x, ring_B, ring_dt, x, dt_processed, A, B, C, D=None, z=None):
    """The replay form for one token after w ring tokens. checkpoint (b, H, P, N); ring_x (b, w, H, P);
    ring_B (b, w, G, N); ring_dt (b, w, H) processed. Returns (y, state after the token), float64:
        y_t = exp(c_t) (S_c C_t) + sum_{j<=t} exp(c_t - c_j) dt_j (B_j . C_t) x_j + D x_t
    """
    H = x.shape[1]
    xs = torch.cat([ring_x.to(f64), x.to(f64)[:, None]], dim=1)          # (b, w+1, H, P)
    Bs = torch.cat([ring_B.to(f64), B.to(f64)[:, None]], dim=1)          # (b, w+1, G, N)
    dts = torch.cat([ring_dt.to(f64), dt_processed.to(f64)[:, None]], dim=1)  # (b, w+1, H)
    A = A.to(f64)
    # exp(c_t - c_j) = exp(A * (dt_{j+1} + ... + dt_t)): reversed cumulative sums, excluding j itself.
    suffix = torch.flip(torch.cumsum(torch.flip(dts, [1]), 1), [1]) - dts  # (b, w+1, H)
    weight = torch.exp(A * suffix) * dts                                   # (b, w+1, H)
    ckpt_decay = torch.exp(A * dts.sum(1))                                 # (b, H)
    Bh = Bs.repeat_interleave(H // B.shape[1], dim=2)                      # (b, w+1, H, N)
    Ct = _heads(C.to(f64), H)                                              # (b, H, N)
    bc = torch.einsum("bjhn,bhn->bjh", Bh, Ct)
    y = ckpt_decay[..., None] * torch.einsum("bhpn,bhn->bhp", checkpoint.to(f64), Ct)
    y = y + torch.einsum("bjh,bjhp->bhp", weight * bc, xs)
    state = ckpt_decay[..., None, None] * checkpoint.to(f64) + torch.einsum("bjh,bjhp,bjhn->bhpn", weight, xs, Bh)
    return _output(y, x, D, z), state


def round_to(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t rounded to dtype's precision (to nearest), kept in float64."""
    return t.to(dtype).to(f64)


def mamba2_verify(checkpoint, ring_x, ring_B, ring_dt, xs, dts_processed, A, Bs, Cs, D=None, zs=None):
    """Outputs of T tentative tokens after w committed ring tokens, float64 (MATH.md, "Verifying T tokens at
    once"): token k's output is the replay form over the ring and the tentative tokens before it; no
    intermediate state is formed. xs (b, T, H, P); dts (b, T, H); Bs, Cs (b, T, G, N); zs (b, T, H, P).
    Returns (b, T, H, P)."""
    ys = []
    for k in range(xs.shape[1]):
        y, _ = mamba2_replay(
            checkpoint,
            torch.cat([ring_x.to(f64), xs[:, :k].to(f64)], 1),
            torch.cat([ring_B.to(f64), Bs[:, :k].to(f64)], 1),
            torch.cat([ring_dt.to(f64), dts_processed[:, :k].to(f64)], 1),
            xs[:, k], dts_processed[:, k], A, Bs[:, k], Cs[:, k], D, None if zs is None else zs[:, k],
        )
        ys.append(y)
    return torch.stack(ys, 1)


def causal_conv1d(seq: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, silu: bool = True,
                  history: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Sequential depthwise causal convolution, float64: seq (t, dim), weight (dim, W); history (W - 1, dim)
    of earlier inputs (zeros when None). out[k] = act(sum_w weight[:, w] * [history, seq][k + w] + bias)."""
    W = weight.shape[1]
    history = torch.zeros(W - 1, seq.shape[1], dtype=f64) if history is None else history.to(f64)
    full = torch.cat([history, seq.to(f64)], 0)
    out = torch.stack([(full[k:k + W].T * weight.to(f64)).sum(1) for k in range(seq.shape[0])])
    if bias is not None:
        out = out + bias.to(f64)
    return F.silu(out) if silu else out
