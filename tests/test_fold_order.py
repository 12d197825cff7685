"""The fold-first row order of the CUDA replay steps (csrc/common/fold_order.cuh) changes which block runs which
batch row and nothing else (its records also carry each row's slot id and cursor, which the blocks take from there;
REPLAYSSM_TUNE order_cursor=0: they read them themselves): the same steps with the order forced on (REPLAYSSM_TUNE replay_fold_first=1) and off
(=0) give the same bits in every output and in every tensor of the cache. A lost or doubled row in the order would
leave an output unwritten (NaN) or append a token twice. With an output view (Mamba-2, and GDN since session 50 where
the key dimension is 128 or more), the folding rows that the order marks serve their outputs from the master rounded to
bf16, staged in a row loop of their own; without the order, or with REPLAYSSM_TUNE view_fold_lean=0, they read the
view itself: the same bits again, since the view is always the master rounded to nearest."""
import dataclasses

import pytest
import torch

import replayssm
from replayssm import PAD_SLOT, GdnReplayCache, Mamba2ReplayCache

from helpers import Layer

L = 4


def _mamba2(num_slots, view, gen, H=4, P=16, G=2, N=32, align_folds=False):
    layer = Layer(H, P, G, N, "cuda", gen)
    cache = Mamba2ReplayCache.allocate(num_slots, H, P, G, N, ring_len=L, act_dtype=torch.bfloat16, device="cuda",
                                       output_view=torch.bfloat16 if view else None, align_folds=align_folds)

    def step(cache, batch, ids, out_like, tok):
        out = torch.full_like(out_like, float("nan"))
        replayssm.mamba2_replay_step(cache, tok["x"], tok["dt"], layer.A, tok["B"], tok["C"], z=tok["z"], slot_ids=ids,
                                     out=out, **layer.kwargs())
        return out
    return cache, step, lambda batch: layer.token(batch, torch.bfloat16, gen), "x"


def _gdn(num_slots, view, gen, align_folds=False, HV=4, H=2, K=32, V=32):
    A_log = (torch.rand(HV, generator=gen) * 2.7).cuda()
    dt_bias = (torch.rand(HV, generator=gen) - 4.0).cuda()
    cache = GdnReplayCache.allocate(num_slots, HV, H, K, V, ring_len=L, device="cuda",
                                    output_view=torch.bfloat16 if view else None, align_folds=align_folds)

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
@pytest.mark.parametrize("align_folds", [False, True], ids=["ring-full", "aligned"])
def test_cuda_fold_first_order_changes_no_bit(monkeypatch, model, batch, view, align_folds):
    """(aligned: the caches' fold phase starts part-way through its cycle, so the steps cross a boundary where every
    row folds; the two orders must still give the same bits, and the rows end aligned. A Mamba-2 view's blocks trap if
    the order marks a row that does not fold; that it marks every folding row is not observable here.)"""
    gen = torch.Generator()
    gen.manual_seed(torch.randint(0, 2**31 - 1, ()).item())
    num_slots = batch + 5
    made = (_mamba2 if model == "mamba2" else _gdn)(num_slots, view, gen, align_folds=align_folds)
    _check_paths(monkeypatch, gen, batch, made, view)


# The Mamba-2 view's loops at shapes where a block runs more row iterations than the staged master has stages (3:
# they wrap), and rows of 2, 4 and 8 lanes (dstate 16, 128, 256; 64, 32 and 16 rows per iteration): blocks of
# `rows` rows, 5 iterations each (the group's last block fewer).
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("N, rows, tune", [(16, 320, ""), (128, 160, ""), (256, 80, ""),
                                           (128, 160, ",view_bps=4"), (128, 96, ",view_bps=4"),
                                           (128, 160, ",view_bps=3"), (128, 96, ",view_bps=3"),
                                           (128, 160, ",m2_replay_stage0_first=0"),  # the prologue waits for every first stage
                                           (128, 96, ",view_bps=3,m2_replay_stage0_first=0"),
                                           (128, 160, ",view_bps=3,m2_replay_stage0_first=0")])  # (6 stages: a master
    # stage deferred; with 4 the master path has 2 and defers none)
def test_cuda_view_fold_paths_change_no_bit(monkeypatch, N, rows, tune):
    """(view_bps=4: 4 blocks per SM, C_t from shared memory, 4 stages: 2 of the staged master, the default at this
    ring; view_bps=3: 3 blocks per SM, 6 stages.)"""
    gen = torch.Generator()
    gen.manual_seed(torch.randint(0, 2**31 - 1, ()).item())
    batch = 70
    made = _mamba2(batch + 5, True, gen, H=8, P=64, G=1, N=N)
    _check_paths(monkeypatch, gen, batch, made, True, extra=f",replay_rows={rows}{tune}")


# The GDN view's staged master loop (K >= 128, csrc/gdn/kernels.cuh kCanStage): the default kernel at K = 128 (four
# stages, two of them the staged master's), the six-stage one (gdn_view_variant=0: three, one deferred past the
# ring's group), the prologue waiting for every first stage, blocks that straddle value heads (96 rows of V = 128),
# and K = 256 (16 lanes a row); blocks of `rows` rows run 4-8 row iterations, more than the master has stages.
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("K, V, rows, tune", [(128, 128, 128, ""), (128, 128, 96, ""), (128, 128, 256, ""),
                                              (128, 128, 128, ",gdn_view_variant=0"),
                                              (128, 128, 128, ",replay_stage0_first=0"),
                                              (128, 128, 96, ",gdn_view_variant=0,replay_stage0_first=0"),
                                              (256, 64, 64, ""),
                                              (128, 128, 128, ",stream_lean=1")])  # (the former default, 32-bit offsets)
@pytest.mark.parametrize("align_folds", [False, True], ids=["ring-full", "aligned"])
def test_cuda_gdn_view_fold_paths_change_no_bit(monkeypatch, K, V, rows, tune, align_folds):
    """(aligned: the four-blocks-an-SM kernel with the phase's code has no staged loop, the six-stage one has)"""
    gen = torch.Generator()
    gen.manual_seed(torch.randint(0, 2**31 - 1, ()).item())
    batch = 70
    made = _gdn(batch + 5, True, gen, align_folds=align_folds, HV=4, H=2, K=K, V=V)
    _check_paths(monkeypatch, gen, batch, made, True, extra=f",gdn_replay_rows={rows}{tune}")


def _check_paths(monkeypatch, gen, batch, made, lean_fold, extra=""):
    """2L + 1 steps of a cache with staggered cursors, in the fold-first order and in the grid's order (and in the
    fold-first order with the blocks reading slot ids and cursors themselves; with lean_fold, with the folding rows
    reading the view): the same bits in every output and cache tensor."""
    cache, step, token, out_key = made
    num_slots = cache.cursor.shape[0]
    cache.checkpoint.copy_(torch.randn(cache.checkpoint.shape, generator=gen) * 0.1)
    if cache.view is not None:
        cache.view.copy_(cache.checkpoint)
    cache.cursor.copy_(torch.randint(0, L, (num_slots,), generator=gen, dtype=torch.int32))  # staggered
    aligned = cache.fold_phase is not None
    if aligned:
        cache.fold_phase[0] = int(torch.randint(1, L, (), generator=gen))  # (a boundary within the steps below)
    twin = _clone(cache)
    # More copies in the fold-first order: its blocks reading their slot ids and cursors themselves instead of taking
    # them from the order's records (order_cursor=0); with a view, the folding rows reading the view.
    others = {t: _clone(cache) for t in ("order_cursor=0",) + (("view_fold_lean=0",) if lean_fold else ())}
    ids = torch.randperm(num_slots, generator=gen)[:batch].to(torch.int32)
    ids[torch.randperm(batch, generator=gen)[:batch // 10]] = PAD_SLOT  # pad rows among the live ones
    live = ids != PAD_SLOT
    ids = ids.cuda()
    for t in range(2 * L + 1):
        folding = int((cache.cursor[ids[live.cuda()].long()] == L - 1).sum())
        assert aligned or 0 < folding < int(live.sum()), t  # (staggered cursors: some rows fold at every step, not all)
        tok = token(batch)
        monkeypatch.setenv("REPLAYSSM_TUNE", "replay_fold_first=1" + extra)
        out_first = step(cache, batch, ids, tok[out_key], tok)
        monkeypatch.setenv("REPLAYSSM_TUNE", "replay_fold_first=0" + extra)
        out_grid = step(twin, batch, ids, tok[out_key], tok)
        for tune, other in others.items():
            monkeypatch.setenv("REPLAYSSM_TUNE", "replay_fold_first=1," + tune + extra)
            out_other = step(other, batch, ids, tok[out_key], tok)
            assert torch.equal(out_first[live], out_other[live]), (t, tune)
            _assert_same_cache(cache, other, (t, tune))
        assert not out_first[live].isnan().any(), t
        assert torch.equal(out_first[live], out_grid[live]), t
        assert out_first[~live].isnan().all() and out_grid[~live].isnan().all(), t
        _assert_same_cache(cache, twin, t)
    if aligned:  # (the phase boundary passed: every live row at the phase)
        assert set(cache.cursor[ids[live.cuda()].long()].tolist()) == {int(cache.fold_phase[0])}


# An fp32 checkpoint's folding steps run two row iterations per trip in grids past one resident wave (REPLAYSSM_TUNE
# fold_pair=1 forces it here; csrc/mamba2/replay_step.cuh, csrc/gdn/kernels.cuh), the same arithmetic per row in the
# same order as one per trip: the same bits. Blocks of an odd number of row iterations (Mamba-2's fp32 rows of N =
# 128 are 32 per iteration: 160 rows are 5; GDN's 16: 48 are 3), of an even one (192 and 96: 6; the group's last
# block fewer) and of one; every Mamba-2 row layout (N = 16 .. 256) and activation dtype; GDN's default kernel (K =
# 128, bf16), its generic 3-stage one (fp16 activations, K = 64, variant 0) and variant 1. (GDN pairs only with
# 16-bit activations: with fp32 ones the launcher takes the kernel without them.)
_PAIR_CASES = [("mamba2", 32, 128, torch.bfloat16, ""), ("mamba2", 160, 128, torch.bfloat16, ""),
               ("mamba2", 192, 128, torch.bfloat16, ""), ("mamba2", 160, 128, torch.bfloat16, ",stream_lean=0"),
               ("mamba2", 160, 128, torch.bfloat16, ",m2_replay_stage0_first=0"),
               ("mamba2", 160, 16, torch.float16, ""), ("mamba2", 96, 32, torch.float32, ""),
               ("mamba2", 160, 64, torch.bfloat16, ""), ("mamba2", 80, 256, torch.float16, ""),
               ("gdn", 16, 128, torch.bfloat16, ""), ("gdn", 48, 128, torch.bfloat16, ""), ("gdn", 96, 128, torch.bfloat16, ""),
               ("gdn", 48, 128, torch.float16, ""), ("gdn", 48, 64, torch.bfloat16, ""),
               ("gdn", 48, 128, torch.bfloat16, ",gdn_replay_variant=0"),
               ("gdn", 48, 128, torch.bfloat16, ",gdn_replay_variant=1"), ("gdn", 48, 128, torch.bfloat16, ",stream_lean=0"),
               ("gdn", 48, 128, torch.bfloat16, ",stream_lean=1")]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("model, rows, dim, act_dtype, tune", _PAIR_CASES,
                         ids=[f"{m}-{r}rows-{d}-{str(a)[6:]}{t.replace(',', '-')}" for m, r, d, a, t in _PAIR_CASES])
def test_cuda_fold_pair_changes_no_bit(monkeypatch, model, rows, dim, act_dtype, tune):
    gen = torch.Generator()
    gen.manual_seed(torch.randint(0, 2**31 - 1, ()).item())
    batch, num_slots = 40, 45
    if model == "mamba2":
        H, P, G, N = 8, 64, 2, dim
        layer = Layer(H, P, G, N, "cuda", gen)
        cache = Mamba2ReplayCache.allocate(num_slots, H, P, G, N, ring_len=L, act_dtype=act_dtype, align_folds=False,
                                           device="cuda")
        knob = "replay_rows"

        def token(batch):
            return layer.token(batch, act_dtype, gen)

        def step(c, ids, tok, out):
            replayssm.mamba2_replay_step(c, tok["x"], tok["dt"], layer.A, tok["B"], tok["C"], z=tok["z"], slot_ids=ids,
                                         out=out, **layer.kwargs())
        out_key = "x"
    else:
        HV, H, K, V = 4, 2, dim, 128
        A_log = (torch.rand(HV, generator=gen) * 2.7).cuda()
        dt_bias = (torch.rand(HV, generator=gen) - 4.0).cuda()
        cache = GdnReplayCache.allocate(num_slots, HV, H, K, V, ring_len=L, align_folds=False, device="cuda")
        knob = "gdn_replay_rows"

        def token(batch):
            rnd = lambda *s: torch.randn(batch, *s, generator=gen).to("cuda", act_dtype)
            return dict(q=rnd(H, K), k=rnd(H, K), v=rnd(HV, V), a=rnd(HV), b=rnd(HV))

        def step(c, ids, tok, out):
            replayssm.gdn_replay_step(c, **tok, A_log=A_log, dt_bias=dt_bias, slot_ids=ids, out=out)
        out_key = "v"
    cache.checkpoint.copy_(torch.randn(cache.checkpoint.shape, generator=gen) * 0.1)
    cache.cursor.copy_(torch.randint(0, L, (num_slots,), generator=gen, dtype=torch.int32))  # staggered
    twin = _clone(cache)
    ids = torch.randperm(num_slots, generator=gen)[:batch].to(torch.int32)
    ids[torch.randperm(batch, generator=gen)[:batch // 10]] = PAD_SLOT
    live = ids != PAD_SLOT
    ids = ids.cuda()
    outs = {}
    for t in range(2 * L + 1):
        assert int((cache.cursor[ids[live.cuda()].long()] == L - 1).sum()) > 0, t  # some rows fold at every step
        tok = token(batch)
        for c, pair in ((cache, 1), (twin, 0)):
            monkeypatch.setenv("REPLAYSSM_TUNE", f"fold_pair={pair},{knob}={rows}{tune}")
            outs[pair] = torch.full_like(tok[out_key], float("nan"))
            step(c, ids, tok, outs[pair])
        assert not outs[1][live].isnan().any(), t
        assert torch.equal(outs[1][live], outs[0][live]), t
        _assert_same_cache(cache, twin, t)
