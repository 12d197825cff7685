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


# ------------------------------------------------------------------------------------------ Gated DeltaNet
# q, k: (b, H, K) per key head; v: (b, HV, V) per value head (HV a multiple of H); state (b, HV, V, K).

L2_NORM_EPS = 1e-6


def gdn_prepare(q, k, a, b, A_log, dt_bias=None, l2norm=True, scale=None):
    """Inputs as the recurrence uses them, float64: q, k L2-normalised (x / sqrt(sum x^2 + eps)) when asked,
    q scaled (default K^-1/2), expanded to value heads; g = -exp(A_log) softplus(a + dt_bias); beta = sigmoid(b)."""
    q, k = q.to(f64), k.to(f64)
    if l2norm:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + L2_NORM_EPS)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + L2_NORM_EPS)
    q = q * (q.shape[-1] ** -0.5 if scale is None else scale)
    a = a.to(f64) + (0 if dt_bias is None else dt_bias.to(f64))
    g = -torch.exp(A_log.to(f64)) * F.softplus(a)
    return q, k, g, torch.sigmoid(b.to(f64))


def _value_heads(t, HV):
    return t.repeat_interleave(HV // t.shape[-2], dim=-2)


def gdn_step(state, q, k, v, g, beta):
    """One sequential step on prepared inputs (gdn_prepare): S_t = alpha S (I - beta k k^T) + beta v k^T,
    o = S_t q. Returns (o (b, HV, V), new state), float64."""
    HV = v.shape[1]
    qh, kh = _value_heads(q, HV), _value_heads(k, HV)
    alpha = torch.exp(g)[..., None, None]
    S = state.to(f64)
    new = alpha * (S - beta[..., None, None] * torch.einsum("bhvk,bhk,bhj->bhvj", S, kh, kh)) + \
        beta[..., None, None] * v.to(f64)[..., None] * kh[:, :, None, :]
    return torch.einsum("bhvk,bhk->bhv", new, qh), new


def gdn_replay(checkpoint, ring_u, ring_k, ring_g, q, k, v, g, beta):
    """The replay form for one token after w ring tokens (MATH.md): ring_u (b, w, HV, V), ring_k (b, w, H, K)
    normalised, ring_g (b, w, HV). Returns (o, u, state after the token), float64."""
    HV = v.shape[1]
    qh, kh = _value_heads(q, HV), _value_heads(k, HV)
    rk = _value_heads(ring_k.to(f64), HV)                                     # (b, w, HV, K)
    G = ring_g.to(f64)
    suffix = torch.flip(torch.cumsum(torch.flip(G, [1]), 1), [1]) - G      # g_{j+1} + ... + g_{w-1}
    wdec = torch.exp(suffix)                                                  # (b, w, HV)
    cdec = torch.exp(G.sum(1))[..., None]                                     # (b, HV, 1)
    S = checkpoint.to(f64)
    U = ring_u.to(f64) * wdec[..., None]                                      # (b, w, HV, V)
    Sk = cdec * torch.einsum("bhvk,bhk->bhv", S, kh) + torch.einsum("bjhv,bjhk,bhk->bhv", U, rk, kh)
    Sq = cdec * torch.einsum("bhvk,bhk->bhv", S, qh) + torch.einsum("bjhv,bjhk,bhk->bhv", U, rk, qh)
    alpha = torch.exp(g)[..., None]
    u = beta[..., None] * (v.to(f64) - alpha * Sk)
    o = alpha * Sq + u * (kh * qh).sum(-1, keepdim=True)
    prev = cdec[..., None] * S + torch.einsum("bjhv,bjhk->bhvk", U, rk)
    return o, u, alpha[..., None] * prev + u[..., None] * kh[:, :, None, :]


def gdn_verify(state_h, q, k, v, g, beta):
    """T tokens after the committed history whose state is state_h (b, HV, V, K), by the triangular system of
    MATH.md: A_ij = beta_i exp(G_i - G_j) (k_i . k_j) for j < i, (I + A) U = R with
    R_i = beta_i (v_i - exp(G_i) S_h k_i); o_i = exp(G_i) S_h q_i + sum_{j<=i} exp(G_i - G_j) u_j (k_j . q_i).
    q, k (b, T, H, K); v (b, T, HV, V); g, beta (b, T, HV), prepared. Returns o (b, T, HV, V), float64."""
    HV = v.shape[2]
    qh, kh = _value_heads(q, HV), _value_heads(k, HV)                         # (b, T, HV, K)
    G = torch.cumsum(g, 1)                                                    # (b, T, HV)
    S = state_h.to(f64)
    decay = torch.exp(G[:, :, None, :] - G[:, None, :, :])                    # [i, j] = exp(G_i - G_j)
    kk = torch.einsum("bihk,bjhk->bijh", kh, kh)
    T = q.shape[1]
    strict = torch.tril(torch.ones(T, T, dtype=torch.bool), -1)[None, :, :, None]
    A = torch.where(strict, beta[:, :, None, :] * decay * kk, torch.zeros((), dtype=f64))
    R = beta[..., None] * (v.to(f64) - torch.exp(G)[..., None] * torch.einsum("bhvk,bihk->bihv", S, kh))
    M = torch.eye(T, dtype=f64)[None, :, :, None] + A                         # (b, T, T, HV)
    U = torch.linalg.solve_triangular(M.permute(0, 3, 1, 2), R.permute(0, 2, 1, 3), upper=False)  # (b, HV, T, V)
    U = U.permute(0, 2, 1, 3)
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))[None, :, :, None]
    W = torch.where(causal, decay * torch.einsum("bjhk,bihk->bijh", kh, qh), torch.zeros((), dtype=f64))
    return torch.exp(G)[..., None] * torch.einsum("bhvk,bihk->bihv", S, qh) + torch.einsum("bijh,bjhv->bihv", W, U)
