"""replayssm: state-space decoding the ReplaySSM way (checkpoint + ring, output-only steps).

Importing the package loads the compiled library, which registers the ops under torch.ops.replayssm.
"""
import torch

from . import _C  # noqa: F401  (registers torch.ops.replayssm.*)
from . import ops
from .cache import ConvCache, GdnReplayCache, Mamba2ReplayCache
from .ops import (PAD_SLOT, causal_conv1d_commit, causal_conv1d_verify, gdn_materialize, gdn_replay_commit,
                  gdn_replay_state, gdn_replay_step, gdn_replay_verify, gdn_step, mamba2_materialize, mamba2_replay_commit,
                  mamba2_replay_state, mamba2_replay_step, mamba2_replay_verify, mamba2_step)

__all__ = ["PAD_SLOT", "ConvCache", "GdnReplayCache", "Mamba2ReplayCache", "causal_conv1d_commit", "causal_conv1d_verify",
           "gdn_materialize", "gdn_replay_commit", "gdn_replay_state", "gdn_replay_step", "gdn_replay_verify", "gdn_step",
           "mamba2_materialize", "mamba2_replay_commit", "mamba2_replay_state", "mamba2_replay_step", "mamba2_replay_verify",
           "mamba2_step", "ops"]


def cuda_built() -> bool:
    """True when the CUDA kernels were compiled into the library."""
    return torch._C._dispatch_has_kernel_for_dispatch_key("replayssm::mamba2_step", "CUDA")
