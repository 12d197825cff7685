"""Typed wrappers over torch.ops.replayssm.* with shapes, and the fake kernels for torch.compile.

Shapes: batch rows b, slots s (the state pool), heads H, head dim P, groups G (H % G == 0), state size N,
ring length L. Activations (x, dt, B, C, z, out) share one dtype (fp32, bf16 or fp16); A, D and dt_bias are
fp32 per head. A row whose slot id is PAD_SLOT is skipped: nothing of its slot, ring, cursor or output is
read or written. Slots of one batch must be distinct. An out-of-range slot raises on the CPU and is a
device-side assert on the GPU (checking it on the host would need a sync).
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from .cache import ConvCache, GdnReplayCache, Mamba2ReplayCache

PAD_SLOT = -1
"""Slot id of a padding row."""

DT_LIMIT_NONE = (0.0, math.inf)


def mamba2_step(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    slot_ids: torch.Tensor,
    D: Optional[torch.Tensor] = None,
    z: Optional[torch.Tensor] = None,
    dt_bias: Optional[torch.Tensor] = None,
    dt_softplus: bool = False,
    dt_limit: Tuple[float, float] = DT_LIMIT_NONE,
    out: Optional[torch.Tensor] = None,
    dst_slot_ids: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Standard Mamba-2 decode step; reads and writes ``state[slot_ids[b]]`` in place.

    With ``dst_slot_ids`` (b,) (the dtype of slot_ids; padding exactly where slot_ids is) the new state is
    written to ``state[dst_slot_ids[b]]`` and the source slot is left as it was: one state per draft
    position, as engines keep them for speculative decoding. A destination must not be another row's source.

    state (s, H, P, N) fp32/bf16/fp16; x (b, H, P); dt (b, H) raw; A (H,) = -exp(A_log); B, C (b, G, N);
    D (H,); z (b, H, P) gate; dt_bias (H,); slot_ids (b,) int32/int64. Returns out (b, H, P).
    dt = clamp(softplus(dt + dt_bias) if dt_softplus else dt + dt_bias, *dt_limit).
    """
    if out is None:
        out = torch.empty_like(x)
    torch.ops.replayssm.mamba2_step(
        state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, float(dt_limit[0]), float(dt_limit[1]), slot_ids, out,
        dst_slot_ids,
    )
    return out


def mamba2_replay_step(
    cache: Mamba2ReplayCache,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    slot_ids: torch.Tensor,
    D: Optional[torch.Tensor] = None,
    z: Optional[torch.Tensor] = None,
    dt_bias: Optional[torch.Tensor] = None,
    dt_softplus: bool = False,
    dt_limit: Tuple[float, float] = DT_LIMIT_NONE,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Replay Mamba-2 decode step: the same outputs as :func:`mamba2_step` on the same history, computed
    from the slot's checkpoint and ring without writing the checkpoint. The token is appended to the ring
    and the slot's cursor advances; when the ring is full the step folds instead (checkpoint <- state after
    this token, cursor <- 0), so the checkpoint is written at most once every ``cache.ring_len`` tokens. With the cache's
    aligned folds (``cache.fold_phase``, the default without an output view) a row also folds, early, at the
    cache's phase boundary, so that every row folds at the same step (replayssm/cache.py, "Aligned folds").
    Arguments as for :func:`mamba2_step`; x and B must have the cache's activation dtype.
    A cache is driven either by this step or by verify/commit: after a commit the cursor may equal ring_len,
    which this step rejects (on the GPU as a device-side assert); use :func:`mamba2_replay_verify` with T = 1
    on a speculative cache instead.
    """
    if out is None:
        out = torch.empty_like(x)
    torch.ops.replayssm.mamba2_replay_step(
        cache.checkpoint, cache.ring_x, cache.ring_B, cache.ring_dt, cache.cursor, cache.arrivals,
        x, dt, A, B, C, D, z, dt_bias, dt_softplus, float(dt_limit[0]), float(dt_limit[1]), slot_ids, out,
        cache.view, cache.sr_seed, cache.fold_count, cache.fold_phase,
    )
    return out


def mamba2_replay_state(
    cache: Mamba2ReplayCache,
    A: torch.Tensor,
    slot_ids: torch.Tensor,
    positions: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The fp32 state of each slot (the checkpoint with its ring folded in): (b, H, P, N). At the slot's cursor,
    or, with ``positions`` (b,) int32, after the first ``positions[b]`` ring tokens (0 <= position <= cursor:
    any committed position since the last fold; for prefix caching, handing a sequence over, debugging).
    Reads only; the cache is unchanged. Pad rows of ``out`` are left as they are."""
    if out is None:
        s, H, P, N = cache.checkpoint.shape
        out = torch.zeros(slot_ids.shape[0], H, P, N, dtype=torch.float32, device=cache.checkpoint.device)
    torch.ops.replayssm.mamba2_replay_state(
        cache.checkpoint, cache.ring_x, cache.ring_B, cache.ring_dt, cache.cursor, A, slot_ids, positions, out
    )
    return out


def mamba2_replay_verify(
    cache: Mamba2ReplayCache,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    slot_ids: torch.Tensor,
    num_tokens: Optional[torch.Tensor] = None,
    D: Optional[torch.Tensor] = None,
    z: Optional[torch.Tensor] = None,
    dt_bias: Optional[torch.Tensor] = None,
    dt_softplus: bool = False,
    dt_limit: Tuple[float, float] = DT_LIMIT_NONE,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Speculative verification (CPU and CUDA, caches with the numerical split too; tested on an H200 against the
    CPU). For each row, T tentative tokens x (b, T, H, P), dt (b, T, H), B and C (b, T, G, N),
    z (b, T, H, P) get the outputs the sequential recurrence would give them after the slot's committed tokens,
    computed from the checkpoint and the ring: no intermediate state is formed. ``num_tokens`` (b,) int32 in 1..T
    gives rows fewer tokens (the rest of their x/out is ignored/untouched). The tokens are written into the ring
    after the cursor, which does not move: :func:`mamba2_replay_commit` accepts some of them. Fold policy: when the
    window would not fit (cursor + T > ring_len), the committed history is folded first (checkpoint <- state at
    the cursor, cursor <- 0), so a cache for speculation is sized ring_len = history + window.
    """
    if out is None:
        out = torch.empty_like(x)
    torch.ops.replayssm.mamba2_replay_verify(
        cache.checkpoint, cache.ring_x, cache.ring_B, cache.ring_dt, cache.cursor, x, dt, A, B, C, D, z, dt_bias,
        dt_softplus, float(dt_limit[0]), float(dt_limit[1]), slot_ids, num_tokens, out, cache.pending, cache.arrivals,
        cache.view, cache.sr_seed, cache.fold_count,
    )
    return out


def mamba2_replay_commit(cache: Mamba2ReplayCache, slot_ids: torch.Tensor, accepted: torch.Tensor) -> None:
    """Accept the first ``accepted[b]`` (int32) tokens of the last verify of each row: the cursor moves over
    them; rejected tokens are simply overwritten later. Device-side, no sync, graph-safe. ``accepted[b]`` must
    not exceed the row's token count in that verify (``cache.pending``, recorded by verify and consumed here):
    more is an error on the CPU and clamped on the GPU, where nothing can be raised."""
    torch.ops.replayssm.mamba2_replay_commit(cache.cursor, cache.ring_len, slot_ids, accepted,  # any replay cache
                                             getattr(cache, "pending", None))


def causal_conv1d_verify(cache: ConvCache, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
                         silu: bool = True, slot_ids: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Depthwise causal convolution of T tentative inputs x (b, T, dim) per row, from each slot's conv state:
    out[b, k] = act(sum_w weight[:, w] * seq[k + w] + bias) over seq = [state, x[b]]. The state is not
    touched; the inputs are kept in ``cache.conv_window`` for :func:`causal_conv1d_commit`. weight (dim, W) and
    bias (dim,) fp32; x, out in the cache's dtype. CPU and CUDA."""
    if out is None:
        out = torch.empty_like(x)
    torch.ops.replayssm.causal_conv1d_verify(cache.conv_state, cache.conv_window, x, weight, bias, silu, slot_ids, out)
    return out


def causal_conv1d_commit(cache: ConvCache, slot_ids: torch.Tensor, accepted: torch.Tensor) -> None:
    """After accepting ``accepted[b]`` (int32) of the last verified inputs, each slot's conv state becomes exactly
    the state the sequential model would have: the last width - 1 of [state, accepted inputs]."""
    torch.ops.replayssm.causal_conv1d_commit(cache.conv_state, cache.conv_window, slot_ids, accepted)


def gdn_step(state, q, k, v, a, b, A_log, *, slot_ids, dt_bias=None, l2norm=True, scale=None, out=None):
    """Standard Gated DeltaNet decode step; reads and writes ``state[slot_ids[r]]`` (s, HV, V, K) in place.
    q, k (b, H, K); v (b, HV, V); a, b (b, HV) raw gate inputs; A_log, dt_bias (HV,) fp32. g = -exp(A_log)
    softplus(a + dt_bias), beta = sigmoid(b); q and k L2-normalised when ``l2norm``; q scaled by ``scale``
    (default K^-1/2). Returns o (b, HV, V). CPU and CUDA."""
    if out is None:
        out = torch.empty_like(v)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    torch.ops.replayssm.gdn_step(state, q, k, v, a, b, A_log, dt_bias, l2norm, float(scale), slot_ids, out)
    return out


def gdn_replay_step(cache: GdnReplayCache, q, k, v, a, b, A_log, *, slot_ids, dt_bias=None, l2norm=True, scale=None,
                    out=None):
    """Replay Gated DeltaNet step: the outputs of :func:`gdn_step` on the same history, from the checkpoint and
    the ring (u, k, g); appends the token, or folds when the ring is full (or, aligned, at the cache's phase
    boundary: :func:`mamba2_replay_step`). Arguments as :func:`gdn_step`. Caches
    with the numerical split (``output_view``, ``rounding="stochastic"``) on the CPU and CUDA (on CUDA the view
    must be of an fp32 checkpoint; tested on an H200 against the CPU)."""
    if out is None:
        out = torch.empty_like(v)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    torch.ops.replayssm.gdn_replay_step(cache.checkpoint, cache.ring_u, cache.ring_k, cache.ring_g, cache.cursor,
                                        cache.arrivals, q, k, v, a, b, A_log, dt_bias, l2norm, float(scale), slot_ids, out,
                                        cache.view, cache.sr_seed, cache.fold_count, cache.fold_phase)
    return out


def gdn_replay_verify(cache: GdnReplayCache, q, k, v, a, b, A_log, *, slot_ids, num_tokens=None, dt_bias=None,
                      l2norm=True, scale=None, out=None):
    """Speculative verification of T tokens per row (q, k (b, T, H, K); v (b, T, HV, V); a, b (b, T, HV)): the
    outputs the sequential recurrence gives them, from the checkpoint and the ring; their corrections go into
    the ring (a forward substitution through the window). Cursor, early fold and commit
    (:func:`mamba2_replay_commit` works on any replay cache) as for Mamba-2.

    Caches with the numerical split (``output_view``, ``rounding="stochastic"``): an early fold stores the state
    at the cursor as the step's fold does (computed from the master, rounded stochastically with the slot's seed
    and fold count, or to nearest; the view refreshed with the bf16 rounding of the same value) and counts itself
    in ``cache.fold_count``; the window's tokens read the view (or the stored values), as the step's do. On CUDA
    such caches go to the row-pass verify kernel (tested on an H200 against the CPU op); the view only of an fp32
    checkpoint."""
    if out is None:
        out = torch.empty_like(v)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    torch.ops.replayssm.gdn_replay_verify(cache.checkpoint, cache.ring_u, cache.ring_k, cache.ring_g, cache.cursor, q, k, v,
                                          a, b, A_log, dt_bias, l2norm, float(scale), slot_ids, num_tokens, out, cache.pending,
                                          cache.arrivals, cache.view, cache.sr_seed, cache.fold_count)
    return out


def gdn_replay_state(cache: GdnReplayCache, slot_ids, positions=None, out=None):
    """The fp32 state (b, HV, V, K) of each slot at its cursor or at committed ``positions``; read-only."""
    if out is None:
        s, HV, V, K = cache.checkpoint.shape
        out = torch.zeros(slot_ids.shape[0], HV, V, K, dtype=torch.float32, device=cache.checkpoint.device)
    torch.ops.replayssm.gdn_replay_state(cache.checkpoint, cache.ring_u, cache.ring_k, cache.ring_g, cache.cursor, slot_ids,
                                         positions, out)
    return out


# The issues' names for three of the ops above (issue 3: mamba2_materialize; issue 4: gdn_replay_commit,
# gdn_materialize). A commit only moves cursors, so one op serves both layer kinds' caches; a materialisation is a
# state read at a committed position into a buffer of the caller's.
def mamba2_materialize(cache: Mamba2ReplayCache, A: torch.Tensor, slot_ids: torch.Tensor,
                       positions: Optional[torch.Tensor] = None, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The fp32 state of each slot at its cursor or at committed ``positions`` written into ``out`` (b, H, P, N):
    for prefix caching, for handing a sequence to an engine that keeps full states (``pool[dst] = out``), for
    debugging. The same as :func:`mamba2_replay_state`."""
    return mamba2_replay_state(cache, A, slot_ids, positions, out)


def gdn_replay_commit(cache: GdnReplayCache, slot_ids: torch.Tensor, accepted: torch.Tensor) -> None:
    """Accept the first ``accepted[b]`` tokens of the last :func:`gdn_replay_verify` of each row (the cursor moves;
    device-side, graph-safe). The same op as :func:`mamba2_replay_commit`."""
    mamba2_replay_commit(cache, slot_ids, accepted)


def gdn_materialize(cache: GdnReplayCache, slot_ids, positions=None, out=None):
    """The fp32 state (b, HV, V, K) of each slot at its cursor or at committed ``positions`` written into ``out``.
    The same as :func:`gdn_replay_state`."""
    return gdn_replay_state(cache, slot_ids, positions, out)


def stochastic_round(x: torch.Tensor, seed: int, fold: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """x (fp32) rounded to bf16/fp16 up or down at random, unbiased, with the same Philox stream as the folds
    of a slot with this seed at this fold count (element i of the flattened tensor uses counter i)."""
    return torch.ops.replayssm.stochastic_round(x, seed, fold, dtype)


# Fake kernels: the ops only mutate their (a!) arguments and return nothing, so shape propagation has
# nothing to compute. They let torch.compile trace the ops without running them.
@torch.library.register_fake("replayssm::mamba2_step")
def _mamba2_step_fake(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_min, dt_max, slot_ids, out,
                      dst_slot_ids=None):
    return None


@torch.library.register_fake("replayssm::mamba2_replay_step")
def _mamba2_replay_step_fake(checkpoint, ring_x, ring_B, ring_dt, cursor, arrivals, x, dt, A, B, C, D, z, dt_bias,
                             dt_softplus, dt_min, dt_max, slot_ids, out, view=None, sr_seed=None, fold_count=None,
                             fold_phase=None):
    return None


@torch.library.register_fake("replayssm::stochastic_round")
def _stochastic_round_fake(x, seed, fold, dtype):
    return torch.empty_like(x, dtype=dtype)


@torch.library.register_fake("replayssm::mamba2_replay_state")
def _mamba2_replay_state_fake(checkpoint, ring_x, ring_B, ring_dt, cursor, A, slot_ids, positions, out):
    return None


@torch.library.register_fake("replayssm::mamba2_replay_verify")
def _mamba2_replay_verify_fake(checkpoint, ring_x, ring_B, ring_dt, cursor, x, dt, A, B, C, D, z, dt_bias, dt_softplus,
                               dt_min, dt_max, slot_ids, num_tokens, out, pending=None,
                               arrivals=None, view=None, sr_seed=None, fold_count=None):
    return None


@torch.library.register_fake("replayssm::mamba2_replay_commit")
def _mamba2_replay_commit_fake(cursor, ring_len, slot_ids, accepted, pending=None):
    return None


@torch.library.register_fake("replayssm::causal_conv1d_verify")
def _causal_conv1d_verify_fake(conv_state, conv_window, x, weight, bias, silu, slot_ids, out):
    return None


@torch.library.register_fake("replayssm::causal_conv1d_commit")
def _causal_conv1d_commit_fake(conv_state, conv_window, slot_ids, accepted):
    return None


@torch.library.register_fake("replayssm::gdn_step")
def _gdn_step_fake(state, q, k, v, a, b, A_log, dt_bias, l2norm, scale, slot_ids, out):
    return None


@torch.library.register_fake("replayssm::gdn_replay_step")
def _gdn_replay_step_fake(checkpoint, ring_u, ring_k, ring_g, cursor, arrivals, q, k, v, a, b, A_log, dt_bias, l2norm, scale,
                          slot_ids, out, view=None, sr_seed=None, fold_count=None, fold_phase=None):
    return None


@torch.library.register_fake("replayssm::gdn_replay_verify")
def _gdn_replay_verify_fake(checkpoint, ring_u, ring_k, ring_g, cursor, q, k, v, a, b, A_log, dt_bias, l2norm, scale,
                            slot_ids, num_tokens, out, pending=None, arrivals=None, view=None, sr_seed=None,
                            fold_count=None):
    return None


@torch.library.register_fake("replayssm::gdn_replay_state")
def _gdn_replay_state_fake(checkpoint, ring_u, ring_k, ring_g, cursor, slot_ids, positions, out):
    return None
