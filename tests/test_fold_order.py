"""The fold-first row order of the CUDA replay steps (csrc/common/fold_order.cuh) changes which block runs which
batch row and nothing else: the same steps with the order forced on (REPLAYSSM_TUNE replay_fold_first=1) and off
(=0) give the same bits in every output and in every tensor of the cache. A lost or doubled row in the order would
leave an output unwritten (NaN) or append a token twice. With a Mamba-2 output view, the folding rows' outputs come
from the master rounded to bf16 (the order marks them, so they never read the view; without the order they learn it
from the cursor) or, with REPLAYSSM_TUNE view_fold_lean=0, from the view itself: the same bits again, since the view
is always the master rounded to nearest."""
import dataclasses

import pytest
import torch

import replayssm
from replayssm import PAD_SLOT, GdnReplayCache, Mamba2ReplayCache

from helpers import Layer

L = 4


def _mamba2(num_slots, view, gen):
    H, P, G, N = 4, 16, 2, 32
    layer = Layer(H, P, G, N, "cuda", gen)
    cache = Mamba2ReplayCache.allocate(num_slots, H, P, G, N, ring_len=L, act_dtype=torch.bfloat16, device="cuda",
                                       output_view=torch.bfloat16 if view else None)

    def step(cache, batch, ids, out_like, tok):
        out = torch.full_like(out_like, float("nan"))
        replayssm.mamba2_replay_step(cache, tok["x"], tok["dt"], layer.A, tok["B"], tok["C"], z=tok["z"], slot_ids=ids,
                                     out=out, **layer.kwargs())
        return out
    return cache, step, lambda batch: layer.token(batch, torch.bfloat16, gen), "x"


def _gdn(num_slots, view, gen):
    HV, H, K, V = 4, 2, 32, 32
    A_log = (torch.rand(HV, generator=gen) * 2.7).cuda()
    dt_bias = (torch.rand(HV, generator=gen) - 4.0).cuda()
    cache = GdnReplayCache.allocate(num_slots, HV, H, K, V, ring_len=L, device="cuda",
                                    output_view=torch.bfloat16 if view else None)

    def token(batch):
        rnd = lambda *s: torch.randn(batch, *s, generator=gen).to("cuda", torch.bfloat16)
        return dict(q=rnd(H, K), k=rnd(H, K), v=rnd(HV, V), a=rnd(HV), b=rnd(HV))

    def step(cache, batch, ids, out_like, tok):
        out = torch.full_like(out_like, float("nan"))
        replayssm.gdn_replay_step(cache, **tok, A_log=A_log, dt_bias=dt_bias, slot_ids=ids, out=out)
        return out
    return cache, step, token, "v"


def _clone(cache):
    return dataclasses.replace(cache, **{f.name: getattr(cache, f.name).clone() for f in dataclasses.fields(cache)
                                         if isinstance(getattr(cache, f.name), torch.Tensor)})


def _assert_same_cache(a, b, where):
    """Every tensor of the two caches, bit for bit."""
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        assert (x is None and y is None) or torch.equal(x, y), (where, f.name)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("view", [False, True], ids=["plain", "view"])
@pytest.mark.parametrize("batch", [70, 1100])  # one chunk of the order kernel's 1024 threads, and two
@pytest.mark.parametrize("model", ["mamba2", "gdn"])
def test_cuda_fold_first_order_changes_no_bit(monkeypatch, model, batch, view):
    gen = torch.Generator()
    gen.manual_seed(torch.randint(0, 2**31 - 1, ()).item())
    num_slots = batch + 5
    cache, step, token, out_key = (_mamba2 if model == "mamba2" else _gdn)(num_slots, view, gen)
    cache.checkpoint.copy_(torch.randn(cache.checkpoint.shape, generator=gen) * 0.1)
    if cache.view is not None:
        cache.view.copy_(cache.checkpoint)
    cache.cursor.copy_(torch.randint(0, L, (num_slots,), generator=gen, dtype=torch.int32))  # staggered
    twin = _clone(cache)
    # With a Mamba-2 view, a third copy streams the view at folds as well, its rows in the fold-first order.
    streamed = _clone(cache) if view and model == "mamba2" else None
    ids = torch.randperm(num_slots, generator=gen)[:batch].to(torch.int32)
    ids[torch.randperm(batch, generator=gen)[:batch // 10]] = PAD_SLOT  # pad rows among the live ones
    live = ids != PAD_SLOT
    ids = ids.cuda()
    for t in range(2 * L + 1):
        folding = int((cache.cursor[ids[live.cuda()].long()] == L - 1).sum())
        assert 0 < folding < int(live.sum()), t  # (staggered cursors: some rows fold at every step, not all)
        tok = token(batch)
        monkeypatch.setenv("REPLAYSSM_TUNE", "replay_fold_first=1")
        out_first = step(cache, batch, ids, tok[out_key], tok)
        monkeypatch.setenv("REPLAYSSM_TUNE", "replay_fold_first=0")
        out_grid = step(twin, batch, ids, tok[out_key], tok)
        if streamed is not None:
            monkeypatch.setenv("REPLAYSSM_TUNE", "replay_fold_first=1,view_fold_lean=0")
            out_streamed = step(streamed, batch, ids, tok[out_key], tok)
            assert torch.equal(out_first[live], out_streamed[live]), t
            _assert_same_cache(cache, streamed, t)
        assert not out_first[live].isnan().any(), t
        assert torch.equal(out_first[live], out_grid[live]), t
        assert out_first[~live].isnan().all() and out_grid[~live].isnan().all(), t
        _assert_same_cache(cache, twin, t)
