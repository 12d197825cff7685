"""Aligned folds (replayssm/cache.py, "Aligned folds"; csrc/common/math.h folds_at): a cache's fold phase makes the
replay step fold every row at the phase boundary as well as when its ring fills. The CUDA kernels agree with the CPU
on every fold (cursors, phase, fold counts exactly; outputs and checkpoints to fp32 rounding) for both layer kinds, at
one row (no count on the device), several rows, pad rows, the small kernels' grids and the general ones', eagerly and
in a CUDA graph; the phase is validated; verify and commit leave it alone."""
import math

import pytest
import torch

import replayssm
from replayssm import PAD_SLOT, GdnReplayCache, Mamba2ReplayCache

from conftest import HAS_CUDA
from helpers import FoldModel, Layer, clone_cache, rel_err, run_chain, token_inputs, tolerance

L = 5


def make_gen():
    return torch.Generator().manual_seed(torch.randint(0, 2**31 - 1, ()).item())


class _Mamba2:
    keys = ("x", "dt", "B", "C", "z")
    act = torch.float32  # (the small kernel takes fp32 activations at this shape)

    def __init__(self, device, gen, num_slots, **alloc):
        H, P, G, N = 8, 64, 2, 128
        self.layer = Layer(H, P, G, N, device, gen)
        self.cache = Mamba2ReplayCache.allocate(num_slots, H, P, G, N, ring_len=L, act_dtype=torch.float32, device=device,
                                                **alloc)
        self.out_shape = (H, P)

    def step(self, cache, ids, x, dt, B, C, z, out):  # (the parameters on the inputs' device: the CUDA test's CPU run)
        kw = {k: v.to(x.device) if isinstance(v, torch.Tensor) else v for k, v in self.layer.kwargs().items()}
        replayssm.mamba2_replay_step(cache, x, dt, self.layer.A.to(x.device), B, C, z=z, slot_ids=ids, out=out, **kw)

    def verify(self, cache, ids, gen, T):
        tok = self.layer.token(ids.shape[0] * T, torch.float32, gen)
        shaped = {k: v.reshape(ids.shape[0], T, *v.shape[1:]) for k, v in tok.items()}
        replayssm.mamba2_replay_verify(cache, shaped["x"], shaped["dt"], self.layer.A, shaped["B"], shaped["C"],
                                       z=shaped["z"], slot_ids=ids, **self.layer.kwargs())


class _Gdn:
    keys = ("q", "k", "v", "a", "b")
    act = torch.bfloat16  # (the small GDN kernel takes bf16 activations and K = 128 only)

    def __init__(self, device, gen, num_slots, **alloc):
        HV, H, K, V = 4, 2, 128, 128
        self.shape = (HV, H, K, V)
        self.A_log = (torch.rand(HV, generator=gen) * math.log(16.0)).to(device)
        self.dt_bias = (torch.rand(HV, generator=gen) - 4.0).to(device)
        self.cache = GdnReplayCache.allocate(num_slots, HV, H, K, V, ring_len=L, device=device, **alloc)
        self.out_shape = (HV, V)
        self.device = device

    def token(self, batch, gen, T=None):
        HV, H, K, V = self.shape
        lead = (batch,) if T is None else (batch, T)
        rnd = lambda *s: torch.randn(*lead, *s, generator=gen).to(self.device, self.act)
        return dict(q=rnd(H, K), k=rnd(H, K), v=rnd(HV, V), a=rnd(HV), b=rnd(HV))

    def step(self, cache, ids, q, k, v, a, b, out):  # (the parameters on the inputs' device, as _Mamba2's)
        replayssm.gdn_replay_step(cache, q, k, v, a, b, self.A_log.to(q.device), slot_ids=ids,
                                  dt_bias=self.dt_bias.to(q.device), out=out)

    def verify(self, cache, ids, gen, T):
        replayssm.gdn_replay_verify(cache, **self.token(ids.shape[0], gen, T), A_log=self.A_log, slot_ids=ids,
                                    dt_bias=self.dt_bias)


def _inputs(made, batch, gen, tokens):
    if isinstance(made, _Mamba2):
        return token_inputs(made.layer, batch, torch.float32, gen, tokens, made.keys)
    toks = [made.token(batch, gen) for _ in range(tokens)]
    return [torch.stack([t[k] for t in toks]) for k in made.keys]


def _fill(cache, gen):
    """Random checkpoint and ring contents, staggered cursors, the phase part-way through its cycle."""
    cache.checkpoint.copy_(torch.randn(cache.checkpoint.shape, generator=gen) * 0.1)
    for name in ("ring_x", "ring_B", "ring_u", "ring_k"):
        if hasattr(cache, name):
            t = getattr(cache, name)
            t.copy_(torch.randn(t.shape, generator=gen) * (1.0 if name != "ring_k" else 0.1))
    if hasattr(cache, "ring_dt"):
        cache.ring_dt.copy_(torch.rand(cache.ring_dt.shape, generator=gen) * 0.1)
    else:
        cache.ring_g.copy_(-torch.rand(cache.ring_g.shape, generator=gen) * 0.1)
    cache.cursor.copy_(torch.randint(0, L, cache.cursor.shape, generator=gen, dtype=torch.int32))
    cache.fold_phase[0] = int(torch.randint(0, L, (), generator=gen))


@pytest.mark.parametrize("model", [_Mamba2, _Gdn], ids=["mamba2", "gdn"])
@pytest.mark.parametrize("rows", ["one", "pad-only", "several", "many"])
def test_cpu_aligned_folds_follow_the_rule(model, rows):
    """On the CPU the cursors follow FoldModel (a row folds when its ring fills or at the phase boundary) and the
    phase advances once per call, pad-only calls too; after the first boundary every live row sits at the phase."""
    gen = make_gen()
    ids = {"one": [2], "pad-only": [PAD_SLOT], "several": [3, PAD_SLOT, 0, 5], "many": list(range(7))}[rows]
    made = model("cpu", gen, 7)
    cache = made.cache
    assert cache.fold_phase is not None  # (the default without an output view)
    _fill(cache, gen)
    ids_t = torch.tensor(ids, dtype=torch.int32)
    live = [s for s in ids if s != PAD_SLOT]
    model_ = FoldModel(cache)
    inputs = _inputs(made, len(ids), gen, 2 * L + 1)
    for t in range(2 * L + 1):
        before = cache.checkpoint.clone()
        out = torch.full((len(ids),) + made.out_shape, float("nan"), dtype=made.act)
        made.step(cache, ids_t, *(x[t] for x in inputs), out)
        folds = model_.step(live)
        assert cache.cursor.tolist() == model_.cursor and cache.fold_phase.tolist() == [model_.phase, 0], t
        for s in live:
            assert (not torch.equal(cache.checkpoint[s], before[s])) == folds[s], (t, s)
        if live:
            assert torch.isfinite(out[[i for i, s in enumerate(ids) if s != PAD_SLOT]]).all()
    assert len({model_.cursor[s] for s in live} | {model_.phase}) == 1  # aligned


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
@pytest.mark.parametrize("model", [_Mamba2, _Gdn], ids=["mamba2", "gdn"])
@pytest.mark.parametrize("rows", ["one", "pad-only", "one-and-pad", "several", "many"])
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_cuda_aligned_folds_equal_the_cpu(monkeypatch, model, rows, graph):
    """The CUDA replay steps (the small kernels at these grids up to "several" (GDN's: bf16 activations, K = 128), the
    general ones at "many" = 40 rows, and forced with replay_small=0) against the CPU over 2L + 1 steps from staggered cursors and a phase part-way through its cycle: the same
    cursors, phase and zeroed counts; outputs and checkpoints to fp32 rounding."""
    gen = make_gen()
    num_slots = 45
    ids = {"one": [7], "pad-only": [PAD_SLOT], "one-and-pad": [PAD_SLOT, 4], "several": [3, PAD_SLOT, 0, 5],
           "many": torch.randperm(num_slots, generator=gen)[:40].tolist()}[rows]
    if rows == "many":
        ids[5] = ids[17] = PAD_SLOT
    made = model("cuda", gen, num_slots)
    _fill(made.cache, gen)
    cpu = clone_cache(made.cache)
    cpu = type(cpu)(**{k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in vars(cpu).items()})
    tokens = 2 * L + 1
    inputs = _inputs(made, len(ids), gen, tokens)
    outs = torch.full((tokens, len(ids)) + made.out_shape, float("nan"), dtype=made.act, device="cuda")
    ids_gpu, ids_cpu = torch.tensor(ids, dtype=torch.int32, device="cuda"), torch.tensor(ids, dtype=torch.int32)
    for tune in ("", "replay_small=0,gdn_replay_small=0"):
        got_out = outs.clone()
        got = run_chain(monkeypatch, {"REPLAYSSM_TUNE": tune, "REPLAYSSM_PDL": "0"},
                        lambda pools, *xs: made.step(pools[0], ids_gpu, *xs), [clone_cache(made.cache)], inputs, got_out,
                        graph)[0]
        want = clone_cache(cpu)
        want_out = torch.full(outs.shape, float("nan"), dtype=made.act)
        for t in range(tokens):
            made.step(want, ids_cpu, *(x[t].cpu() for x in inputs), want_out[t])
        assert got["cursor"].cpu().tolist() == want.cursor.tolist(), tune
        assert got["fold_phase"].cpu().tolist() == want.fold_phase.tolist(), tune
        assert not got["arrivals"].any() and got["fold_phase"][1].item() == 0, tune
        live = [i for i, s in enumerate(ids) if s != PAD_SLOT]
        pad = [i for i, s in enumerate(ids) if s == PAD_SLOT]
        assert torch.isnan(got_out[:, pad]).all(), tune
        if live:
            assert rel_err(got_out[:, live], want_out[:, live]) < tolerance(made.act, torch.float32), tune
            slots = [ids[i] for i in live]
            # fp32 checkpoints from the same inputs, summed in another order: fp32 arithmetic over a few folds
            # (tolerance(fp32, fp32) ~ 2e-5, the bound test_numerics and test_speculative hold GPU folds to)
            err = rel_err(got["checkpoint"][slots], want.checkpoint[slots])
            assert err < tolerance(torch.float32, torch.float32), (tune, err)
        others = sorted(set(range(num_slots)) - {s for s in ids if s != PAD_SLOT})
        assert torch.equal(got["checkpoint"][others], made.cache.checkpoint[others]), tune  # untouched


@pytest.mark.parametrize("model", [_Mamba2, _Gdn], ids=["mamba2", "gdn"])
def test_verify_and_commit_leave_the_phase(device, model):
    """Speculative verification folds early by its own rule (the window must fit) and neither reads nor advances the
    phase; commit moves cursors only."""
    gen = make_gen()
    made = model(device, gen, 3)
    cache = made.cache
    _fill(cache, gen)  # (a random checkpoint and ring: a fold changes the checkpoint)
    # Slot 0's window fits (1 + 3 <= L): no fold, though the phase is at the boundary, where a replay step would fold
    # every row; slot 2's does not (3 + 3 > L): it folds by verify's own rule, its window then from position 0.
    cache.cursor.copy_(torch.tensor([1, 4, 3], dtype=torch.int32))
    cache.fold_phase[0] = L - 1
    before = cache.checkpoint.clone()
    ids = torch.tensor([0, 2], dtype=torch.int32, device=device)
    made.verify(cache, ids, gen, T=3)
    assert torch.equal(cache.checkpoint[0], before[0]), "a window that fits folds nothing, at the phase boundary too"
    assert not torch.equal(cache.checkpoint[2], before[2]), "a window that does not fit folds"
    assert torch.equal(cache.checkpoint[1], before[1])  # (not in the batch)
    replayssm.mamba2_replay_commit(cache, ids, torch.tensor([1, 3], dtype=torch.int32, device=device))
    assert cache.fold_phase.tolist() == [L - 1, 0]
    assert cache.cursor.tolist() == [1 + 1, 4, 0 + 3]


def test_allocation_and_bad_phases():
    """align_folds: None (aligned unless there is an output view), True, False; a phase outside [0, ring_len), a count
    that is not zero, or a tensor of the wrong shape, dtype or device is an error naming fold_phase."""
    assert Mamba2ReplayCache.allocate(2, 4, 8, 2, 16, ring_len=L).fold_phase.tolist() == [0, 0]
    assert Mamba2ReplayCache.allocate(2, 4, 8, 2, 16, output_view=torch.bfloat16).fold_phase is None
    assert Mamba2ReplayCache.allocate(2, 4, 8, 2, 16, output_view=torch.bfloat16, align_folds=True).fold_phase is not None
    assert GdnReplayCache.allocate(2, 4, 2, 16, 16, align_folds=False).fold_phase is None
    assert GdnReplayCache.allocate(2, 4, 2, 16, 16).fold_phase is not None
    with pytest.raises(ValueError, match="align_folds"):
        GdnReplayCache.allocate(2, 4, 2, 16, 16, align_folds=1)
    gen = make_gen()
    made = _Mamba2("cpu", gen, 2)
    ids = torch.tensor([0, 1], dtype=torch.int32)
    inputs = [x[0] for x in _inputs(made, 2, gen, 1)]
    out = torch.empty((2,) + made.out_shape)
    for bad, match in ((torch.tensor([L, 0], dtype=torch.int32), r"fold_phase\[0\] = 5"),
                       (torch.tensor([-1, 0], dtype=torch.int32), r"fold_phase\[0\] = -1"),
                       (torch.tensor([0, 3], dtype=torch.int32), r"fold_phase\[1\] must be 0"),
                       (torch.zeros(3, dtype=torch.int32), "fold_phase"),
                       (torch.zeros(2, dtype=torch.int64), "fold_phase")):
        made.cache.fold_phase = bad
        with pytest.raises(ValueError, match=match):
            made.step(made.cache, ids, *inputs, out)


@pytest.mark.parametrize("model", [_Mamba2, _Gdn], ids=["mamba2", "gdn"])
def test_opcheck_with_a_fold_phase(device, model):
    """The schemas' fold_phase (mutated, optional, last) through torch.library.opcheck, at a phase boundary."""
    gen = make_gen()
    made = model(device, gen, 3)
    cache = made.cache
    cache.fold_phase[0] = L - 1
    ids = torch.tensor([2, 0], dtype=torch.int32, device=device)
    inputs = [x[0] for x in _inputs(made, 2, gen, 1)]
    out = torch.empty((2,) + made.out_shape, dtype=made.act, device=device)
    split = (None, None, None, cache.fold_phase)  # view, sr_seed, fold_count, fold_phase
    if model is _Mamba2:
        x, dt, B, C, z = inputs
        layer = made.layer
        args = (cache.checkpoint, cache.ring_x, cache.ring_B, cache.ring_dt, cache.cursor, cache.arrivals, x, dt, layer.A, B,
                C, layer.D, z, layer.dt_bias, True, 0.0, float("inf"), ids, out) + split
        torch.library.opcheck(torch.ops.replayssm.mamba2_replay_step.default, args)
    else:
        q, k, v, a, b = inputs
        args = (cache.checkpoint, cache.ring_u, cache.ring_k, cache.ring_g, cache.cursor, cache.arrivals, q, k, v, a, b,
                made.A_log, made.dt_bias, True, q.shape[-1] ** -0.5, ids, out) + split
        torch.library.opcheck(torch.ops.replayssm.gdn_replay_step.default, args)
