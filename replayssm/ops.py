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

from .cache import Mamba2ReplayCache

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
) -> torch.Tensor:
    """Standard Mamba-2 decode step; reads and writes ``state[slot_ids[b]]`` in place.

    state (s, H, P, N) fp32/bf16/fp16; x (b, H, P); dt (b, H) raw; A (H,) = -exp(A_log); B, C (b, G, N);
    D (H,); z (b, H, P) gate; dt_bias (H,); slot_ids (b,) int32/int64. Returns out (b, H, P).
    dt = clamp(softplus(dt + dt_bias) if dt_softplus else dt + dt_bias, *dt_limit).
    """
    if out is None:
        out = torch.empty_like(x)
    torch.ops.replayssm.mamba2_step(
        state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, float(dt_limit[0]), float(dt_limit[1]), slot_ids, out
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
    this token, cursor <- 0), so the checkpoint is written once every ``cache.ring_len`` tokens.
    Arguments as for :func:`mamba2_step`; x and B must have the cache's activation dtype.
    """
    if out is None:
        out = torch.empty_like(x)
    torch.ops.replayssm.mamba2_replay_step(
        cache.checkpoint, cache.ring_x, cache.ring_B, cache.ring_dt, cache.cursor, cache.arrivals,
        x, dt, A, B, C, D, z, dt_bias, dt_softplus, float(dt_limit[0]), float(dt_limit[1]), slot_ids, out,
    )
    return out


def mamba2_replay_state(
    cache: Mamba2ReplayCache, A: torch.Tensor, slot_ids: torch.Tensor, out: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """The fp32 state of each slot at its cursor (the checkpoint with the ring folded in): (b, H, P, N).
    Reads only; the cache is unchanged. Pad rows of ``out`` are left as they are."""
    if out is None:
        s, H, P, N = cache.checkpoint.shape
        out = torch.zeros(slot_ids.shape[0], H, P, N, dtype=torch.float32, device=cache.checkpoint.device)
    torch.ops.replayssm.mamba2_replay_state(
        cache.checkpoint, cache.ring_x, cache.ring_B, cache.ring_dt, cache.cursor, A, slot_ids, out
    )
    return out


# Fake kernels: the ops only mutate their (a!) arguments and return nothing, so shape propagation has
# nothing to compute. They let torch.compile trace the ops without running them.
@torch.library.register_fake("replayssm::mamba2_step")
def _mamba2_step_fake(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_min, dt_max, slot_ids, out):
    return None


@torch.library.register_fake("replayssm::mamba2_replay_step")
def _mamba2_replay_step_fake(checkpoint, ring_x, ring_B, ring_dt, cursor, arrivals, x, dt, A, B, C, D, z, dt_bias,
                             dt_softplus, dt_min, dt_max, slot_ids, out):
    return None


@torch.library.register_fake("replayssm::mamba2_replay_state")
def _mamba2_replay_state_fake(checkpoint, ring_x, ring_B, ring_dt, cursor, A, slot_ids, out):
    return None
