"""The replay cache of one Mamba-2 layer: a pool of checkpoints, a ring of recent inputs per slot, and
per-slot cursors, all on the device.

Layouts (s slots, L ring length, H heads, P head dim, G groups, N state size):
    checkpoint (s, H, P, N)   fp32 by default: the state every later token is built from
    ring_x     (s, L, H, P)   activation dtype: x of the tokens since the checkpoint
    ring_B     (s, L, G, N)   activation dtype: B of those tokens (per group, shared by its heads)
    ring_dt    (s, L, H)      fp32: their processed dt (after bias, softplus and limits)
    cursor     (s,) int32     how many tokens the ring holds; advanced by the replay step on the device
    arrivals   (s,) int32     zero between steps; the CUDA kernel's blocks count in on it to advance cursors
    fold_phase (2,) int32     or None: the aligned folds' phase (below) and a count the CUDA kernels keep (zero
                              between steps)

A step with cursor w reads ring positions 0..w-1 and writes position w, or, when w + 1 == L, folds: the
checkpoint becomes the state after the token and the cursor returns to 0. So the checkpoint is written
once every L tokens and the ring is small beside it (P + N/(H/G) + 1 values per token and head).

Aligned folds (``fold_phase``, the default for caches without an output view). The cache keeps a phase p that
each replay step advances by one (mod L); a step folds a row when its ring fills *or* when p == L - 1 (an early
fold of the w tokens the ring holds: the same formula, any w). So rows that start at different cursors (sequences
that joined the batch at different tokens) fold together from the first phase boundary on, at most one extra
fold each, and then every L-th step folds every row while the others fold none. Why: with staggered cursors every
step folds 1/L of the rows, and a folding row's blocks take ~2.5x a plain row's, so at batches whose grid is
resident at once (up to ~32-128 rows) every launch lasts as long as its folding blocks. Aligned, the same bytes ran
faster in every measured case: H100, one run each, against the same caches without a phase, GDN replay -1.0 / -7.1 /
-2.8 / -2.0 / -0.3% at batch 1 / 8 / 32 / 128 / 256, Mamba-2 -1.7 / -1.8 / -2.0 / -1.2 / -0.9% (bench/results/session42).
With an output view the folds cost ~5-7x a plain row and the fold-first order (common/fold_order.cuh) spreads
them better than aligning (aligned was 0.3-2.6% slower at batch 128-256: the views' cursors_aligned entries,
bench/results/session31-37), so view caches do not align unless asked.
The phase advances once per call with at least one row (pad rows count; a call of batch 0 does nothing): a cache
stepped in several calls per token (sub-batches) should not align, and a slot left out of a call falls out of step
and folds early again at the next boundary.
The verify and commit ops neither read nor advance it (their cursors move by accepted counts).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

MIN_RING_LEN = 2
MAX_RING_LEN = 64
DEFAULT_RING_LEN = 16


def fold_phase_tensor(align_folds: Optional[bool], output_view, device) -> Optional[torch.Tensor]:
    """The aligned folds' (2,) int32 [phase, count] (both 0), or None; align_folds None: align without a view."""
    if align_folds is None:
        align_folds = output_view is None
    if not isinstance(align_folds, bool):
        raise ValueError(f"align_folds must be None, True or False, got {align_folds!r}")
    return torch.zeros(2, dtype=torch.int32, device=device) if align_folds else None


def split_tensors(num_slots, state_shape, checkpoint_dtype, output_view, rounding, seed, device):
    """The numerical split's cache tensors (both layer kinds): the bf16 view of the checkpoint (or None), and
    for stochastic rounding the per-slot Philox seeds and fold counters (or None, None)."""
    if output_view not in (None, torch.bfloat16):
        raise ValueError(f"output_view must be None or torch.bfloat16, got {output_view}")
    if rounding not in ("nearest", "stochastic"):
        raise ValueError(f"rounding must be 'nearest' or 'stochastic', got {rounding!r}")
    if rounding == "stochastic" and checkpoint_dtype == torch.float32:
        raise ValueError("stochastic rounding needs a bf16 or fp16 checkpoint_dtype")
    view = None if output_view is None else torch.zeros(num_slots, *state_shape, dtype=output_view, device=device)
    if rounding != "stochastic":
        return view, None, None
    # Seeds of distinct slots differ: a 64-bit mix of (seed, slot).
    sr_seed = (torch.arange(num_slots, dtype=torch.int64) * -7046029254386353131 + seed).to(device)
    return view, sr_seed, torch.zeros(num_slots, dtype=torch.int32, device=device)


@dataclass
class Mamba2ReplayCache:
    checkpoint: torch.Tensor
    ring_x: torch.Tensor
    ring_B: torch.Tensor
    ring_dt: torch.Tensor
    cursor: torch.Tensor
    arrivals: torch.Tensor
    # The numerical split (MATH.md): a bf16 view of the checkpoint that serves outputs, refreshed by each fold;
    # per-slot seeds for stochastic rounding of a narrow checkpoint at folds, and the fold counter Philox uses.
    # Invariant: view == checkpoint.to(bfloat16) (round to nearest) at all times; allocate, reset_slots and every
    # fold keep it. The CUDA Mamba-2 replay step relies on it: a folding row serves its output from the master it
    # reads for the fold, rounded, instead of reading the view. Whoever writes checkpoint rows directly must write
    # the view's too (reset_slots(cache, ids, state) does both).
    view: Optional[torch.Tensor] = None
    sr_seed: Optional[torch.Tensor] = None
    fold_count: Optional[torch.Tensor] = None
    # Tokens of the last verify not yet committed, per slot: commit checks/clamps accepted counts with it.
    pending: Optional[torch.Tensor] = None
    # Aligned folds (module docstring): [phase, CUDA count], or None.
    fold_phase: Optional[torch.Tensor] = None

    @classmethod
    def allocate(
        cls,
        num_slots: int,
        nheads: int,
        headdim: int,
        ngroups: int,
        dstate: int,
        *,
        ring_len: int = DEFAULT_RING_LEN,
        act_dtype: torch.dtype = torch.bfloat16,
        checkpoint_dtype: torch.dtype = torch.float32,
        output_view: Optional[torch.dtype] = None,
        rounding: str = "nearest",
        seed: int = 0,
        align_folds: Optional[bool] = None,
        device: torch.device | str = "cpu",
    ) -> "Mamba2ReplayCache":
        """A cache of ``num_slots`` empty slots (zero checkpoints, empty rings).

        output_view=torch.bfloat16 keeps a bf16 copy of the checkpoint that every replay step reads for its
        output instead of the master; the master is then touched only at folds (on CUDA: of an fp32 checkpoint).
        rounding="stochastic" (bf16/fp16 checkpoint) rounds the checkpoint at folds stochastically with Philox,
        seeded per slot from ``seed``: reproducible, unbiased, the same on the CPU and the GPU.
        align_folds (default: True without an output view, False with one) gives the cache a fold phase, so that
        the replay step folds every row at the same step (module docstring, "Aligned folds")."""
        if not MIN_RING_LEN <= ring_len <= MAX_RING_LEN:
            raise ValueError(f"ring_len must be in [{MIN_RING_LEN}, {MAX_RING_LEN}], got {ring_len}")
        if nheads % ngroups:
            raise ValueError(f"nheads ({nheads}) must be a multiple of ngroups ({ngroups})")
        view, sr_seed, fold_count = split_tensors(num_slots, (nheads, headdim, dstate), checkpoint_dtype, output_view,
                                                  rounding, seed, device)
        kw = dict(device=device)
        return cls(
            checkpoint=torch.zeros(num_slots, nheads, headdim, dstate, dtype=checkpoint_dtype, **kw),
            # Rings are filled before they are read (the cursor says how far); zeros keep them finite anyway.
            ring_x=torch.zeros(num_slots, ring_len, nheads, headdim, dtype=act_dtype, **kw),
            ring_B=torch.zeros(num_slots, ring_len, ngroups, dstate, dtype=act_dtype, **kw),
            ring_dt=torch.zeros(num_slots, ring_len, nheads, dtype=torch.float32, **kw),
            cursor=torch.zeros(num_slots, dtype=torch.int32, **kw),
            arrivals=torch.zeros(num_slots, dtype=torch.int32, **kw),
            view=view,
            sr_seed=sr_seed,
            fold_count=fold_count,
            pending=torch.zeros(num_slots, dtype=torch.int32, **kw),
            fold_phase=fold_phase_tensor(align_folds, output_view, device),
        )

    @property
    def ring_len(self) -> int:
        return self.ring_x.shape[1]

    @property
    def num_slots(self) -> int:
        return self.checkpoint.shape[0]

    def reset(self, slot_ids: torch.Tensor, state: Optional[torch.Tensor] = None) -> None:
        """Start slots afresh (after prefill): checkpoint <- state (b, H, P, N) or zero, ring emptied.
        Device-side tensor ops only (no sync), so it can run inside a captured graph."""
        reset_slots(self, slot_ids, state)


def reset_slots(cache, slot_ids: torch.Tensor, state: Optional[torch.Tensor] = None) -> None:
    """The reset of any replay cache (Mamba-2 or GDN): checkpoint rows (and the view's) from state or zero,
    cursors and pending windows to 0. Device-side tensor ops only (no sync)."""
    slot_ids = slot_ids.to(device=cache.checkpoint.device, dtype=torch.long)
    if state is None:
        cache.checkpoint.index_fill_(0, slot_ids, 0)
    else:
        expected = (slot_ids.shape[0],) + tuple(cache.checkpoint.shape[1:])
        if tuple(state.shape) != expected:
            raise ValueError(f"state must have shape {expected}, got {tuple(state.shape)}")
        cache.checkpoint.index_copy_(0, slot_ids, state.to(cache.checkpoint.dtype))
    if getattr(cache, "view", None) is not None:
        cache.view.index_copy_(0, slot_ids, cache.checkpoint.index_select(0, slot_ids).to(cache.view.dtype))
    if cache.pending is not None:
        cache.pending.index_fill_(0, slot_ids, 0)
    cache.cursor.index_fill_(0, slot_ids, 0)


@dataclass
class ConvCache:
    """The short convolution's cache of one layer under speculation:
        conv_state  (s, dim, width - 1)  the last width - 1 committed inputs, oldest first
        conv_window (s, T, dim)          the inputs of the last verified window (tentative)
    """

    conv_state: torch.Tensor
    conv_window: torch.Tensor

    @classmethod
    def allocate(cls, num_slots: int, dim: int, *, width: int = 4, window: int = 4, dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | str = "cpu") -> "ConvCache":
        if width < 2:
            raise ValueError(f"width must be at least 2, got {width}")
        return cls(conv_state=torch.zeros(num_slots, dim, width - 1, dtype=dtype, device=device),
                   conv_window=torch.zeros(num_slots, window, dim, dtype=dtype, device=device))


@dataclass
class GdnReplayCache:
    """The replay cache of one Gated DeltaNet layer (s slots, L ring, HV value heads, H key heads):
        checkpoint (s, HV, V, K)  fp32 by default
        ring_u     (s, L, HV, V)  fp32: the corrections u_j = beta_j (v_j - alpha_j S_{j-1} k_j), not raw v
        ring_k     (s, L, H, K)   fp32: the normalised keys, per key head
        ring_g     (s, L, HV)     fp32: the log-decays
        cursor, arrivals (s,)     int32, as for Mamba-2
        fold_phase (2,)           int32 or None: aligned folds, as for Mamba-2 (the default without a view)
    The ring is fp32 so that folding it reproduces the sequential state exactly: no activation rounding
    enters the history (it costs (V + K/(HV/H) + 1) * 4 bytes per token and value head, ~1% of the state).
    """

    checkpoint: torch.Tensor
    ring_u: torch.Tensor
    ring_k: torch.Tensor
    ring_g: torch.Tensor
    cursor: torch.Tensor
    arrivals: torch.Tensor
    pending: Optional[torch.Tensor] = None  # tokens of the last verify not yet committed, per slot
    # The numerical split, as for Mamba-2 (CUDA: the replay step, tested on an H200; verify: CPU, and CUDA written,
    # not yet run on a GPU). The view serves S_c k as well as S_c q, so for GDN its rounding reaches the corrections
    # u (and through them the state): bench/accuracy measures it.
    view: Optional[torch.Tensor] = None
    sr_seed: Optional[torch.Tensor] = None
    fold_count: Optional[torch.Tensor] = None
    fold_phase: Optional[torch.Tensor] = None  # aligned folds, as for Mamba-2

    @classmethod
    def allocate(cls, num_slots: int, nheads: int, nkheads: int, kdim: int, vdim: int, *, ring_len: int = DEFAULT_RING_LEN,
                 checkpoint_dtype: torch.dtype = torch.float32, output_view: Optional[torch.dtype] = None,
                 rounding: str = "nearest", seed: int = 0, align_folds: Optional[bool] = None,
                 device: torch.device | str = "cpu") -> "GdnReplayCache":
        """Options as :meth:`Mamba2ReplayCache.allocate` (``output_view``, ``rounding``, ``seed``, ``align_folds``)."""
        if not MIN_RING_LEN <= ring_len <= MAX_RING_LEN:
            raise ValueError(f"ring_len must be in [{MIN_RING_LEN}, {MAX_RING_LEN}], got {ring_len}")
        if nheads % nkheads:
            raise ValueError(f"value heads ({nheads}) must be a multiple of key heads ({nkheads})")
        view, sr_seed, fold_count = split_tensors(num_slots, (nheads, vdim, kdim), checkpoint_dtype, output_view, rounding,
                                                  seed, device)
        kw = dict(device=device, dtype=torch.float32)
        return cls(view=view, sr_seed=sr_seed, fold_count=fold_count,
            checkpoint=torch.zeros(num_slots, nheads, vdim, kdim, dtype=checkpoint_dtype, device=device),
            ring_u=torch.zeros(num_slots, ring_len, nheads, vdim, **kw),
            ring_k=torch.zeros(num_slots, ring_len, nkheads, kdim, **kw),
            ring_g=torch.zeros(num_slots, ring_len, nheads, **kw),
            cursor=torch.zeros(num_slots, dtype=torch.int32, device=device),
            arrivals=torch.zeros(num_slots, dtype=torch.int32, device=device),
            pending=torch.zeros(num_slots, dtype=torch.int32, device=device),
            fold_phase=fold_phase_tensor(align_folds, output_view, device),
        )

    @property
    def ring_len(self) -> int:
        return self.ring_u.shape[1]

    def reset(self, slot_ids: torch.Tensor, state: Optional[torch.Tensor] = None) -> None:
        """Start slots afresh: checkpoint <- state (b, HV, V, K) or zero, ring emptied (device-side, no sync)."""
        reset_slots(self, slot_ids, state)
