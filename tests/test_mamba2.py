"""Mamba-2 standard and replay decode steps against the float64 reference (../shared/docs/MATH.md)."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import replayssm
from replayssm import PAD_SLOT, Mamba2ReplayCache
from replayssm import reference as R

from conftest import HAS_CUDA
from helpers import (DTYPES, UNIT_ROUNDOFF, FoldModel, Layer, assert_chains_agree, assert_kernel_ran,
                     assert_only_batch_slots_moved, clone_cache, rel_err, run_chain, token_inputs, tolerance)


def assert_same_cache(a, b):
    for k, v in vars(a).items():
        assert (v is None and getattr(b, k) is None) or torch.equal(v, getattr(b, k)), k


def make_gen(seed=None):
    gen = torch.Generator()
    gen.manual_seed(seed if seed is not None else torch.randint(0, 2**31 - 1, ()).item())
    return gen


def run_sequence(device, *, H, P, N, G, L, batch, num_slots, T, act_dtype, state_dtype, gen, pad_rows=(),
                 join_at=None, view_pool=False, align_folds=None):
    """Decode T tokens with both ops side by side and with the float64 reference; return per-token errors.

    Row b is a pad row for tokens t < join_at[b] (so rows sit at different cursors) and for every token when
    b is in pad_rows. The reference rounds the state where each op stores it: every token for the standard
    step, at folds for the replay checkpoint.
    """
    layer = Layer(H, P, G, N, device, gen)
    slots = torch.randperm(num_slots, generator=gen)[:batch]
    init = torch.randn(num_slots, H, P, N, generator=gen) * 0.5
    if view_pool:  # pools that are views of larger tensors (a slice of heads of a wider pool)
        pool = torch.empty(num_slots, H + 2, P, N, dtype=state_dtype, device=device)[:, 1:H + 1]
        pool.copy_(init)
    else:
        pool = init.to(device, state_dtype)
    cache = Mamba2ReplayCache.allocate(num_slots, H, P, G, N, ring_len=L, act_dtype=act_dtype,
                                       checkpoint_dtype=state_dtype, align_folds=align_folds, device=device)
    if view_pool:
        cache.checkpoint = torch.empty(num_slots, H + 2, P, N, dtype=state_dtype, device=device)[:, 1:H + 1]
    cache.checkpoint.copy_(init)
    ref_std = init.to(state_dtype).double()
    ref_rep = ref_std.clone()
    model = FoldModel(cache)
    join_at = join_at or [0] * batch
    errs = []
    for t in range(T):
        tok = layer.token(batch, act_dtype, gen)
        if view_pool:
            wide = torch.empty(batch, H, P + 8, dtype=act_dtype, device=device)[..., :P]
            wide.copy_(tok["x"])
            tok["x"] = wide
        active = [b for b in range(batch) if b not in pad_rows and t >= join_at[b]]
        ids = torch.full((batch,), PAD_SLOT, dtype=torch.int32)
        ids[active] = slots[active].to(torch.int32)
        ids = ids.to(device)
        out_std = torch.full_like(tok["x"], float("nan"))
        out_rep = torch.full_like(tok["x"], float("nan"))
        replayssm.mamba2_step(pool, tok["x"], tok["dt"], layer.A, tok["B"], tok["C"], z=tok["z"], slot_ids=ids,
                              out=out_std, **layer.kwargs())
        replayssm.mamba2_replay_step(cache, tok["x"], tok["dt"], layer.A, tok["B"], tok["C"], z=tok["z"],
                                     slot_ids=ids, out=out_rep, **layer.kwargs())
        sl = slots[active]
        sub = {k: (v[active].cpu() if v is not None else None) for k, v in tok.items()}
        y_ref, new_std = layer.reference_step(ref_std[sl], sub)
        y_ref_rep, new_rep = layer.reference_step(ref_rep[sl], sub)
        ref_std[sl] = R.round_to(new_std, state_dtype)
        folds = model.step(sl.tolist())
        for i, s in enumerate(sl.tolist()):
            ref_rep[s] = R.round_to(new_rep[i], state_dtype) if folds[s] else new_rep[i]
        errs.append(dict(std=rel_err(out_std[active], y_ref), rep=rel_err(out_rep[active], y_ref_rep),
                         std_vs_rep=rel_err(out_rep[active], out_std[active].double())))
        pad = [b for b in range(batch) if b not in active]
        if pad:  # pad rows' outputs are never written
            assert torch.isnan(out_std[pad]).all() and torch.isnan(out_rep[pad]).all()
    return dict(errs=errs, pool=pool, cache=cache, ref_std=ref_std, ref_rep=ref_rep, cursor=model.cursor, slots=slots,
                layer=layer)


@pytest.mark.parametrize("act_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("state_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("align_folds", [True, False], ids=["aligned", "ring-full"])
def test_replay_and_standard_match_reference_across_folds(device, act_dtype, state_dtype, align_folds):
    """Rows join at different tokens (different cursors); with aligned folds (the default) they fold early once, at
    the first phase boundary, and then together; without, each when its ring fills."""
    L = 8
    res = run_sequence(device, H=8, P=16, N=32, G=2, L=L, batch=5, num_slots=9, T=3 * L + 5, act_dtype=act_dtype,
                       state_dtype=state_dtype, gen=make_gen(), join_at=[0, 1, 3, 7, 2], align_folds=align_folds)
    tol = tolerance(act_dtype, state_dtype)
    worst = {k: max(e[k] for e in res["errs"]) for k in ("std", "rep", "std_vs_rep")}
    assert worst["std"] < tol, worst
    assert worst["rep"] < tol, worst
    assert worst["std_vs_rep"] < 2 * tol, worst
    assert_states_match(res, device, state_dtype)


def assert_states_match(res, device, state_dtype):
    """The state each op keeps at the end of run_sequence (pool; checkpoint + ring) equals the reference's, and the
    cursors the fold rule's."""
    sl = res["slots"]
    state_tol = 4 * UNIT_ROUNDOFF[state_dtype] + 2e-5
    assert rel_err(res["pool"][sl], res["ref_std"][sl]) < state_tol
    got = replayssm.mamba2_replay_state(res["cache"], res["layer"].A, sl.to(device))
    assert rel_err(got, res["ref_rep"][sl]) < state_tol
    assert res["cache"].cursor.cpu()[sl].tolist() == [res["cursor"][s] for s in sl.tolist()]


@pytest.mark.parametrize("shape", [dict(H=24, P=32, N=64, G=3), dict(H=6, P=20, N=16, G=1), dict(H=4, P=8, N=256, G=4)],
                         ids=lambda s: "H{H}P{P}N{N}G{G}".format(**s))
def test_shapes_that_are_not_tile_multiples(device, shape):
    res = run_sequence(device, **shape, L=4, batch=3, num_slots=4, T=11, act_dtype=torch.bfloat16,
                       state_dtype=torch.float32, gen=make_gen(), join_at=[0, 2, 1])
    tol = tolerance(torch.bfloat16, torch.float32)
    assert max(max(e["std"], e["rep"]) for e in res["errs"]) < tol
    assert_states_match(res, device, torch.float32)


CUDA_OPS = ["mamba2_step", "mamba2_replay_step", "mamba2_replay_state", "mamba2_replay_verify", "mamba2_replay_commit",
            "causal_conv1d_verify", "causal_conv1d_commit", "gdn_step", "gdn_replay_step", "gdn_replay_verify",
            "gdn_replay_state"]


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
def test_cuda_every_kernel_is_built_where_there_is_a_gpu():
    """Where a GPU is, the library carries every op's CUDA kernel (a build without nvcc would otherwise show as
    each CUDA test failing on PyTorch's "could not run ... 'CUDA' backend")."""
    assert replayssm.cuda_built()
    missing = [op for op in CUDA_OPS if not torch._C._dispatch_has_kernel_for_dispatch_key(f"replayssm::{op}", "CUDA")]
    assert not missing, missing


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("act_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("state_dtype", DTYPES, ids=str)
def test_cuda_wide_offset_stream_matches_reference(monkeypatch, act_dtype, state_dtype):
    """The replay kernel's 64-bit addressing path (stream_lean=0; what a cache whose offsets within a group pass
    32 bits takes; the default forms them as 32-bit offsets): the same checks as the default across dtypes and
    folds, and on shapes that are not tile multiples."""
    monkeypatch.setenv("REPLAYSSM_TUNE", "stream_lean=0")
    for align_folds in (True, False):
        test_replay_and_standard_match_reference_across_folds("cuda", act_dtype, state_dtype, align_folds)
    if act_dtype == torch.bfloat16 and state_dtype == torch.float32:
        for shape in (dict(H=24, P=32, N=64, G=3), dict(H=6, P=20, N=16, G=1), dict(H=4, P=8, N=256, G=4)):
            test_shapes_that_are_not_tile_multiples("cuda", shape)


def step_chain(monkeypatch, graph, H, P, G, N, batch, num_slots, tokens=3):
    """A chain of `tokens` mamba2_step calls (fp32 state pool, bf16 activations, z, random slots): returns chain(env)
    for assert_chains_agree (each run from a copy of the same pool and inputs, eager or in a CUDA graph), the pool and
    the slot ids."""
    gen = make_gen()
    layer = Layer(H, P, G, N, "cuda", gen)
    ids = torch.randperm(num_slots, generator=gen)[:batch].to(torch.int32).cuda()
    pool = (torch.randn(num_slots, H, P, N, generator=gen) * 0.1).cuda()
    inputs = token_inputs(layer, batch, torch.bfloat16, gen, tokens, ("x", "dt", "B", "C", "z"))
    outs = torch.zeros((tokens, batch, H, P), dtype=torch.bfloat16, device="cuda")

    def one_token(pools, x, dt, B, C, z, out):
        replayssm.mamba2_step(pools[0], x, dt, layer.A, B, C, slot_ids=ids, z=z, out=out, **layer.kwargs())

    def chain(env):
        out = outs.clone()
        return out, run_chain(monkeypatch, env, one_token, [pool.clone()], inputs, out, graph)

    return chain, pool, ids


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("case", [dict(P=64, tune="step_unroll=2,step_bps=1"), dict(P=20, tune="step_unroll=2,step_bps=1"),
                                  dict(P=64, tune="step_unroll=4,step_bps=1"), dict(P=64, tune="")],
                         ids=["8iters", "partial", "unroll4", "1iter"])
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_cuda_staged_step_gives_the_same_bits(monkeypatch, case, graph):
    """mamba2_step with the state of the next 1-3 row iterations in flight (REPLAYSSM_TUNE step_ahead=1..3: cp.async
    into shared-memory stages, x and z an iteration ahead) runs the same fp32 operations in the same order as the
    kernel without (step_ahead=0): over several tokens, with blocks of 8 row iterations (2 rows a thread), of 3 with
    a partial one (P = 20), of 4 (4 rows a thread: at most 2 ahead) and of a single one (this batch's default), the
    staged prologue also in the PDL load order (step_split_loads=1), outputs and states are the same bits, eager
    and in a CUDA graph; slots outside the batch stay as they were."""
    chain, pool, ids = step_chain(monkeypatch, graph, H=8, P=case["P"], G=2, N=128, batch=24, num_slots=27)
    tune = case["tune"] + ("," if case["tune"] else "")
    envs = [{"REPLAYSSM_TUNE": f"{tune}step_ahead={a}"} for a in (0, 1, 2, 3)]
    envs.append({"REPLAYSSM_TUNE": f"{tune}step_ahead=3,step_split_loads=1"})  # the PDL load order (PDL itself:
    # test_cuda_pdl_launches_give_the_same_bits, whose chains of layers keep PDL's contract; one pool here does not)
    assert_only_batch_slots_moved(assert_chains_agree(chain, envs)[1][0], pool, ids)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("batch", [3, 4], ids=["batch3", "batch4"])
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_cuda_step_unroll_rule_gives_the_same_bits(monkeypatch, batch, graph):
    """At the benchmark's layer shape (H = 128, P = 64, N = 128, fp32 state, bf16) and batches where the unstaged step
    picks between 4 and 8 rows in flight a thread (mamba2_step_prefers_unroll8: on an H100 / H200 8 at batch 3, 4 at
    batch 4), the default launch, the former default (step_ahead=0,step_unroll=4) and unroll 8 forced give the same
    bits over several tokens, eager and in a CUDA graph: a row's operations do not depend on how many rows a thread
    keeps in flight; slots outside the batch stay as they were."""
    chain, pool, ids = step_chain(monkeypatch, graph, H=128, P=64, G=8, N=128, batch=batch, num_slots=batch + 2)
    envs = [{"REPLAYSSM_TUNE": ""}, {"REPLAYSSM_TUNE": "step_ahead=0,step_unroll=4"}, {"REPLAYSSM_TUNE": "step_unroll=8"}]
    assert_only_batch_slots_moved(assert_chains_agree(chain, envs)[1][0], pool, ids)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("tune", ["replay_rows=32", "replay_rows=64,replay_prefetch=1", "replay_prefetch=1",
                                  "replay_prefetch=0", "replay_rows=96", "replay_rows=96,replay_prefetch=0",
                                  "stream_lean=0", "stream_lean=0,replay_rows=96",
                                  "step_unroll=1", "step_unroll=2", "step_unroll=8,step_bps=2",
                                  "replay_rows=160", "fold_pair=1", "fold_pair=1,replay_rows=160",
                                  "fold_pair=1,stream_lean=0", "replay_sm_rows=0", "step_ahead=3",
                                  "step_ahead=2,step_unroll=4", "step_ahead=1,step_bps=1",
                                  "step_ahead=0,step_unroll=2", "m2_replay_stage0_first=0",
                                  "m2_replay_stage0_first=0,replay_rows=160", "m2_replay_stage0_first=0,fold_pair=1,replay_rows=96",
                                  "m2_replay_stage0_first=0,stream_lean=0"])
def test_cuda_replay_launch_configurations(monkeypatch, tune):
    """The replay kernel's launch configurations: many blocks per slot (each counting in on the arrival counter),
    blocks that straddle heads (96 rows, P = 64), an odd number of row iterations per block (160 rows: 5; the folds
    take two per trip with fold_pair=1), pad rows, mixed cursors and folds, with and without the ring fetched before
    the cursor, the folds two row iterations per trip (fold_pair=1: the default only past one resident wave); and the standard step's (rows in flight per thread, blocks per
    SM), which the same sequence runs."""
    monkeypatch.setenv("REPLAYSSM_TUNE", tune)
    L = 8
    res = run_sequence("cuda", H=8, P=64, N=128, G=2, L=L, batch=6, num_slots=9, T=2 * L + 3, act_dtype=torch.bfloat16,
                       state_dtype=torch.float32, gen=make_gen(), pad_rows=(4,), join_at=[0, 1, 3, 5, 2, 0])
    tol = tolerance(torch.bfloat16, torch.float32)
    assert max(max(e["std"], e["rep"]) for e in res["errs"]) < tol
    sl = res["slots"][[0, 1, 2, 3, 5]]
    assert res["cache"].cursor.cpu()[sl].tolist() == [res["cursor"][s] for s in sl.tolist()]
    got = replayssm.mamba2_replay_state(res["cache"], res["layer"].A, sl.to("cuda"))
    assert rel_err(got, res["ref_rep"][sl]) < 4 * UNIT_ROUNDOFF[torch.float32] + 2e-5
    assert (res["cache"].arrivals == 0).all()


def test_noncontiguous_pool_views(device):
    res = run_sequence(device, H=4, P=16, N=32, G=2, L=4, batch=3, num_slots=5, T=10, act_dtype=torch.float32,
                       state_dtype=torch.float32, gen=make_gen(), view_pool=True)
    assert not res["pool"].is_contiguous() and not res["cache"].checkpoint.is_contiguous()
    assert max(max(e["std"], e["rep"]) for e in res["errs"]) < tolerance(torch.float32, torch.float32)


def test_pad_rows_and_other_slots_untouched_byte_for_byte(device):
    gen = make_gen()
    H, P, N, G, L = 4, 8, 32, 2, 4
    layer = Layer(H, P, G, N, device, gen)
    num_slots = 6
    pool = torch.randn(num_slots, H, P, N, generator=gen).to(device)
    cache = Mamba2ReplayCache.allocate(num_slots, H, P, G, N, ring_len=L, act_dtype=torch.bfloat16, device=device)
    cache.checkpoint.copy_(pool)
    for t in (cache.ring_x, cache.ring_B, cache.ring_dt):
        t.copy_(torch.randn(t.shape, generator=gen))
    cache.cursor.copy_(torch.randint(0, L, (num_slots,), generator=gen, dtype=torch.int32))
    ids = torch.tensor([3, PAD_SLOT, 0, PAD_SLOT], dtype=torch.int32, device=device)
    untouched = [1, 2, 4, 5]
    before_pool = pool.clone()
    before_cache = {k: v.clone() for k, v in vars(cache).items() if v is not None and k != "fold_phase"}  # (per slot)
    for step in range(2 * L):
        tok = layer.token(4, torch.bfloat16, gen)
        out = torch.full_like(tok["x"], float("nan"))
        replayssm.mamba2_step(pool, tok["x"], tok["dt"], layer.A, tok["B"], tok["C"], z=tok["z"], slot_ids=ids,
                              out=out, **layer.kwargs())
        assert torch.isnan(out[[1, 3]]).all() and torch.isfinite(out[[0, 2]]).all()
        out = torch.full_like(tok["x"], float("nan"))
        replayssm.mamba2_replay_step(cache, tok["x"], tok["dt"], layer.A, tok["B"], tok["C"], z=tok["z"],
                                     slot_ids=ids, out=out, **layer.kwargs())
        assert torch.isnan(out[[1, 3]]).all() and torch.isfinite(out[[0, 2]]).all()
    assert torch.equal(pool[untouched], before_pool[untouched])
    for name, before in before_cache.items():
        assert torch.equal(getattr(cache, name)[untouched], before[untouched]), name


@pytest.mark.parametrize("align_folds", [True, False], ids=["aligned", "ring-full"])
def test_checkpoint_is_written_only_on_fold_steps(device, align_folds):
    """Ring-full folds: each slot when its cursor reaches L - 1. Aligned folds (the default): also every slot at the
    phase boundary (the phase starts at 0: steps L - 1, 2 L - 1, ...), after which the slots fold together."""
    gen = make_gen()
    H, P, N, G, L = 4, 8, 32, 2, 5
    layer = Layer(H, P, G, N, device, gen)
    cache = Mamba2ReplayCache.allocate(4, H, P, G, N, ring_len=L, act_dtype=torch.float32, align_folds=align_folds,
                                       device=device)
    assert (cache.fold_phase is not None) == align_folds
    cache.checkpoint.copy_(torch.randn(cache.checkpoint.shape, generator=gen))
    cache.cursor.copy_(torch.tensor([0, 3, 4, 1], dtype=torch.int32))
    ids = torch.tensor([0, 1, 2, 3], dtype=torch.int32, device=device)
    folds = 0
    for step in range(3 * L):
        tok = layer.token(4, torch.float32, gen)
        before = cache.checkpoint.clone()
        cur = cache.cursor.clone().cpu()
        replayssm.mamba2_replay_step(cache, tok["x"], tok["dt"], layer.A, tok["B"], tok["C"], slot_ids=ids,
                                     **layer.kwargs())
        for s in range(4):
            fold = cur[s].item() == L - 1 or (align_folds and step % L == L - 1)
            changed = not torch.equal(cache.checkpoint[s], before[s])
            assert changed == fold, (step, s, cur[s].item())
            assert cache.cursor[s].item() == (0 if fold else cur[s].item() + 1)
            folds += fold
        if align_folds:
            assert cache.fold_phase.tolist() == [(step + 1) % L, 0]
            if step >= L - 1:  # aligned since the first boundary
                assert cache.cursor.tolist() == [(step + 1) % L] * 4
    # Ring-full: every slot once per L tokens. Aligned: before the boundary, slots 2, 1 and 3 as their rings fill (steps
    # 0, 1, 3), then every slot at steps 4, 9 and 14.
    assert folds == (4 * 3 if not align_folds else 3 + 4 * 3)
    assert torch.equal(cache.arrivals.cpu(), torch.zeros(4, dtype=torch.int32))


def test_reference_replay_form_equals_sequential_recurrence():
    gen = make_gen()
    H, P, N, G, w = 6, 5, 7, 3, 9
    layer = Layer(H, P, G, N, "cpu", gen)
    ckpt = torch.randn(2, H, P, N, generator=gen, dtype=torch.float64)
    state = ckpt.clone()
    toks = [layer.token(2, torch.float64, gen) for _ in range(w + 1)]
    for tok in toks:
        y_seq, state = layer.reference_step(state, tok)
    ring = lambda k: torch.stack([t[k] for t in toks[:w]], 1)
    dts = torch.stack([R.process_dt(t["dt"], layer.dt_bias, True) for t in toks[:w]], 1)
    last = toks[w]
    y_rep, s_rep = R.mamba2_replay(ckpt, ring("x"), ring("B"), dts, last["x"], R.process_dt(last["dt"], layer.dt_bias, True),
                                   layer.A, last["B"], last["C"], layer.D, last["z"])
    assert torch.allclose(y_rep, y_seq, rtol=1e-10, atol=1e-12)
    assert torch.allclose(s_rep, state, rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------------------------------- API

def _small_args(device, act=torch.float32, L=4, gen=None):
    gen = gen or make_gen()
    H, P, N, G = 4, 8, 32, 2
    layer = Layer(H, P, G, N, device, gen)
    cache = Mamba2ReplayCache.allocate(3, H, P, G, N, ring_len=L, act_dtype=act, device=device)
    cache.checkpoint.copy_(torch.randn(cache.checkpoint.shape, generator=gen))
    tok = layer.token(2, act, gen)
    ids = torch.tensor([2, 0], dtype=torch.int32, device=device)
    return layer, cache, tok, ids


def _replay_args(layer, cache, tok, ids, out):
    return (cache.checkpoint, cache.ring_x, cache.ring_B, cache.ring_dt, cache.cursor, cache.arrivals, tok["x"],
            tok["dt"], layer.A, tok["B"], tok["C"], layer.D, tok["z"], layer.dt_bias, True, 0.0, float("inf"), ids, out)


def test_opcheck(device):
    layer, cache, tok, ids = _small_args(device)
    pool = cache.checkpoint.clone()
    out = torch.empty_like(tok["x"])
    torch.library.opcheck(torch.ops.replayssm.mamba2_step.default,
                          (pool, tok["x"], tok["dt"], layer.A, tok["B"], tok["C"], layer.D, tok["z"], layer.dt_bias,
                           True, 0.0, float("inf"), ids, out))
    torch.library.opcheck(torch.ops.replayssm.mamba2_replay_step.default, _replay_args(layer, cache, tok, ids, out))
    state = torch.empty(2, *cache.checkpoint.shape[1:], device=device)
    torch.library.opcheck(torch.ops.replayssm.mamba2_replay_state.default,
                          (cache.checkpoint, cache.ring_x, cache.ring_B, cache.ring_dt, cache.cursor, layer.A, ids, None, state))


def test_torch_compile_fullgraph(device):
    gen = make_gen()
    layer, cache, _, ids = _small_args(device, gen=gen)
    twin = clone_cache(cache)

    tensors = lambda c: (c.checkpoint, c.ring_x, c.ring_B, c.ring_dt, c.cursor, c.arrivals)

    def step(ck, rx, rb, rdt, cur, arr, x, dt, B, C, z, out):
        torch.ops.replayssm.mamba2_replay_step(ck, rx, rb, rdt, cur, arr, x, dt, layer.A, B, C, layer.D, z,
                                               layer.dt_bias, True, 0.0, float("inf"), ids, out)
        return out * 2

    compiled = torch.compile(step, fullgraph=True, dynamic=False)
    for _ in range(cache.ring_len + 2):
        tok = layer.token(2, torch.float32, gen)
        args = (tok["x"], tok["dt"], tok["B"], tok["C"], tok["z"])
        got = compiled(*tensors(cache), *args, torch.empty_like(tok["x"]))
        want = step(*tensors(twin), *args, torch.empty_like(tok["x"]))
        assert torch.equal(got, want)
    assert_same_cache(cache, twin)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
def test_cuda_graph_capture_of_replay_step_matches_eager():
    gen = make_gen()
    L = 6
    layer, cache, tok, ids = _small_args("cuda", act=torch.bfloat16, L=L, gen=gen)
    cache.cursor.copy_(torch.tensor([0, 2, 5], dtype=torch.int32))  # rows at different cursors
    twin = clone_cache(cache)
    static = {k: v.clone() for k, v in tok.items()}
    out = torch.empty_like(tok["x"])
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up outside the graph on a scratch copy
        scratch = clone_cache(cache)
        replayssm.mamba2_replay_step(scratch, static["x"], static["dt"], layer.A, static["B"], static["C"],
                                     z=static["z"], slot_ids=ids, out=out, **layer.kwargs())
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayssm.mamba2_replay_step(cache, static["x"], static["dt"], layer.A, static["B"], static["C"],
                                     z=static["z"], slot_ids=ids, out=out, **layer.kwargs())
    for _ in range(3 * L):
        tok = layer.token(2, torch.bfloat16, gen)
        for k in static:
            static[k].copy_(tok[k])
        graph.replay()
        want = replayssm.mamba2_replay_step(twin, tok["x"], tok["dt"], layer.A, tok["B"], tok["C"], z=tok["z"],
                                            slot_ids=ids, **layer.kwargs())
        assert torch.equal(out, want)
    assert_same_cache(cache, twin)


def test_bad_inputs_raise_clear_errors(device):
    layer, cache, tok, ids = _small_args(device)
    out = torch.empty_like(tok["x"])
    good = _replay_args(layer, cache, tok, ids, out)
    op = torch.ops.replayssm.mamba2_replay_step

    def call(**changes):
        names = ["checkpoint", "ring_x", "ring_B", "ring_dt", "cursor", "arrivals", "x", "dt", "A", "B", "C", "D", "z",
                 "dt_bias", "dt_softplus", "dt_min", "dt_max", "slot_ids", "out"]
        args = dict(zip(names, good))
        args.update(changes)
        op(*args.values())

    with pytest.raises(ValueError, match="A must have dtype Float"):
        call(A=layer.A.to(torch.bfloat16))
    with pytest.raises(ValueError, match=r"C must have shape \(2, 2, 32\)"):
        call(C=tok["C"][:, :, :16])
    with pytest.raises(ValueError, match="x must be contiguous in its last dimension"):
        call(x=tok["x"].transpose(1, 2).contiguous().transpose(1, 2))
    with pytest.raises(ValueError, match="cursor must have dtype Int"):
        call(cursor=cache.cursor.long())
    with pytest.raises(ValueError, match="slot_ids must be int32 or int64"):
        call(slot_ids=ids.float())
    with pytest.raises(ValueError, match="dt_min"):
        call(dt_min=1.0, dt_max=0.5)
    bad_L = Mamba2ReplayCache.allocate(3, 4, 8, 2, 32, ring_len=2, device=device, act_dtype=torch.float32)
    with pytest.raises(ValueError, match=r"ring_len \(ring_x.size\(1\)\) must be in \[2, 64\]"):
        call(ring_x=bad_L.ring_x[:, :1])
    with pytest.raises(ValueError, match="ring_len must be in"):
        Mamba2ReplayCache.allocate(3, 4, 8, 2, 32, ring_len=65)
    if device == "cpu":
        with pytest.raises(IndexError, match=r"slot_ids\[1\] = 3 is out of range"):
            call(slot_ids=torch.tensor([0, 3], dtype=torch.int32))
        with pytest.raises(ValueError, match="must not repeat a slot"):
            call(slot_ids=torch.tensor([1, 1], dtype=torch.int32))
    else:
        with pytest.raises(ValueError, match="B must be on cuda:0 \\(like x\\), got cpu"):
            call(B=tok["B"].cpu())
        odd = Mamba2ReplayCache.allocate(3, 4, 8, 2, 24, device=device, act_dtype=torch.float32)  # (the op rejects it)
        with pytest.raises(ValueError, match="dstate"):
            replayssm.mamba2_replay_step(odd, tok["x"], tok["dt"], layer.A, tok["B"][..., :24].contiguous(),
                                         tok["C"][..., :24].contiguous(), slot_ids=ids)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
def test_cuda_out_of_range_slot_is_a_device_assert_not_a_wild_write():
    # A device-side assert poisons the CUDA context, so it runs in a child process.
    code = textwrap.dedent("""
        import torch, replayssm
        state = torch.zeros(2, 4, 8, 32, device="cuda")
        x = torch.randn(1, 4, 8, device="cuda")
        B = torch.randn(1, 2, 32, device="cuda")
        replayssm.mamba2_step(state, x, torch.randn(1, 4, device="cuda"), -torch.ones(4, device="cuda"), B, B,
                              slot_ids=torch.tensor([7], dtype=torch.int32, device="cuda"))
        torch.cuda.synchronize()
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ))
    assert proc.returncode != 0
    assert "slot_ids[0] = 7 is out of range" in proc.stdout + proc.stderr


@pytest.mark.parametrize("L", [2, 17, 64])
def test_ring_lengths_at_the_limits(device, L):
    # 2 folds every other token; 17 and 64 take the CUDA kernel's long-ring instantiation (rings over 16).
    res = run_sequence(device, H=4, P=16, N=32, G=2, L=L, batch=3, num_slots=4, T=2 * L + 3, act_dtype=torch.bfloat16,
                       state_dtype=torch.float32, gen=make_gen(), join_at=[0, 1, L // 2])
    tol = tolerance(torch.bfloat16, torch.float32)
    assert max(max(e["std"], e["rep"]) for e in res["errs"]) < tol
    assert_states_match(res, device, torch.float32)


def test_reset_starts_a_slot_from_a_given_state(device):
    gen = make_gen()
    H, P, N, G, L = 4, 8, 16, 2, 4
    layer = Layer(H, P, G, N, device, gen)
    cache = Mamba2ReplayCache.allocate(5, H, P, G, N, ring_len=L, act_dtype=torch.float32, device=device)
    ids = torch.tensor([4, 1], dtype=torch.int32, device=device)
    for _ in range(3):  # leave the rings part full
        tok = layer.token(2, torch.float32, gen)
        replayssm.mamba2_replay_step(cache, tok["x"], tok["dt"], layer.A, tok["B"], tok["C"], slot_ids=ids, **layer.kwargs())
    state = torch.randn(2, H, P, N, generator=gen).to(device)
    cache.reset(ids, state)
    assert cache.cursor[ids.long()].tolist() == [0, 0]
    assert torch.equal(replayssm.mamba2_replay_state(cache, layer.A, ids), state)  # cursor 0: the checkpoint itself
    pool = torch.zeros(5, H, P, N, device=device)
    pool[ids.long()] = state
    tok = layer.token(2, torch.float32, gen)
    want = replayssm.mamba2_step(pool, tok["x"], tok["dt"], layer.A, tok["B"], tok["C"], slot_ids=ids, **layer.kwargs())
    got = replayssm.mamba2_replay_step(cache, tok["x"], tok["dt"], layer.A, tok["B"], tok["C"], slot_ids=ids,
                                       **layer.kwargs())
    assert rel_err(got, want.double()) < tolerance(torch.float32, torch.float32)
    with pytest.raises(ValueError, match="state must have shape"):
        cache.reset(ids, state[:1])


def test_demo_runs_and_reports_agreement():
    proc = subprocess.run([sys.executable, "-m", "replayssm", "demo", "--tokens", "40", "--ring-len", "8", "--device", "cpu"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "outputs agree: yes" in proc.stdout
    assert "checkpoint written 5 times in 40 tokens" in proc.stdout


def test_state_at_committed_positions(device):
    """mamba2_replay_state with positions: the state after any number of ring tokens since the last fold."""
    gen = make_gen()
    H, P, N, G, L = 4, 8, 32, 2, 8
    layer = Layer(H, P, G, N, device, gen)
    cache = Mamba2ReplayCache.allocate(3, H, P, G, N, ring_len=L, act_dtype=torch.float32, device=device)
    init = torch.randn(3, H, P, N, generator=gen)
    cache.checkpoint.copy_(init)
    ids = torch.tensor([2, 0], dtype=torch.int32, device=device)
    history = [init[[2, 0]].double()]
    for _ in range(L + 3):  # past one fold: the positions count from it
        tok = layer.token(2, torch.float32, gen)
        replayssm.mamba2_replay_step(cache, tok["x"], tok["dt"], layer.A, tok["B"], tok["C"], z=tok["z"], slot_ids=ids,
                                     **layer.kwargs())
        _, new = layer.reference_step(history[-1], {k: v.cpu() for k, v in tok.items()})
        history = [new] if len(history) == L else history + [new]
    assert cache.cursor[ids.long()].tolist() == [3, 3]
    for pos in range(4):
        positions = torch.tensor([pos, 3 - pos], dtype=torch.int32, device=device)
        got = replayssm.mamba2_replay_state(cache, layer.A, ids, positions=positions)
        assert rel_err(got[0], history[pos][0]) < 2e-5 and rel_err(got[1], history[3 - pos][1]) < 2e-5
    if device == "cpu":  # on the GPU the same check is a device-side assert
        with pytest.raises(ValueError, match="not a committed position"):
            replayssm.mamba2_replay_state(cache, layer.A, ids, positions=torch.tensor([4, 0], dtype=torch.int32))


def test_step_into_another_slot(device):
    """dst_slot_ids: the new state goes to the destination slot and the source is left as it was; outputs and
    the new state equal the in-place step's, bit for bit; every other slot is untouched."""
    gen = make_gen()
    H, P, N, G = 4, 16, 32, 2
    layer = Layer(H, P, G, N, device, gen)
    pool = (torch.randn(7, H, P, N, generator=gen) * 0.5).to(device)
    tok = layer.token(3, torch.float32, gen)
    src = torch.tensor([4, PAD_SLOT, 1], dtype=torch.int32, device=device)
    dst = torch.tensor([6, PAD_SLOT, 2], dtype=torch.int32, device=device)
    inplace = pool.clone()
    out_in = replayssm.mamba2_step(inplace, tok["x"], tok["dt"], layer.A, tok["B"], tok["C"], z=tok["z"], slot_ids=src,
                                   **layer.kwargs())
    moved = pool.clone()
    out_mv = replayssm.mamba2_step(moved, tok["x"], tok["dt"], layer.A, tok["B"], tok["C"], z=tok["z"], slot_ids=src,
                                   dst_slot_ids=dst, **layer.kwargs())
    assert torch.equal(out_mv[[0, 2]], out_in[[0, 2]])
    assert torch.equal(moved[[6, 2]], inplace[[4, 1]])
    assert torch.equal(moved[[0, 1, 3, 4, 5]], pool[[0, 1, 3, 4, 5]])
    if device == "cpu":
        with pytest.raises(ValueError, match="another row reads"):
            replayssm.mamba2_step(moved, tok["x"], tok["dt"], layer.A, tok["B"], tok["C"], slot_ids=src,
                                  dst_slot_ids=torch.tensor([1, PAD_SLOT, 5], dtype=torch.int32), **layer.kwargs())
        with pytest.raises(ValueError, match="padding exactly"):
            replayssm.mamba2_step(moved, tok["x"], tok["dt"], layer.A, tok["B"], tok["C"], slot_ids=src,
                                  dst_slot_ids=torch.tensor([6, 3, 5], dtype=torch.int32), **layer.kwargs())



def _pdl_chain(monkeypatch, kind, env, seed, graph=False, layers=6):
    """`layers` Mamba-2 layers decoded back to back on one stream, each layer's output the next one's x and z (so
    that each launch reads what the launch just ahead of it wrote), for 3L tokens: the outputs of every layer and token, and
    the caches or state pools at the end, with the environment variables `env` set (REPLAYSSM_PDL=1: the steps launch
    with programmatic dependent launch, common/cuda_utils.cuh). With `graph`, one token's launches are captured once (after a
    warm-up on copies of the pools) and replayed, each token's inputs copied into the captured ones."""
    gen = torch.Generator().manual_seed(seed)
    H, P, N, G, batch, num_slots, L = 16, 64, 128, 2, 4, 6, 4
    dev, act = "cuda", torch.bfloat16
    slots = torch.randperm(num_slots, generator=gen)[:batch].to(dev, torch.int32)
    params, pools = [], []
    for _ in range(layers):
        # (small D and C: with z the previous output too, a layer's output is ~ its input squared times these)
        params.append(dict(A=-torch.rand(H, generator=gen).add(0.1).to(dev), D=(torch.randn(H, generator=gen) * 0.1).to(dev),
                           dt_bias=(torch.randn(H, generator=gen) * 0.5).to(dev)))
        init = torch.randn(num_slots, H, P, N, generator=gen) * 0.3
        if kind == "step":
            pools.append(init.to(dev))
        else:
            cache = Mamba2ReplayCache.allocate(num_slots, H, P, G, N, ring_len=L, act_dtype=act, device=dev,
                                               output_view=torch.bfloat16 if kind == "view" else None)
            cache.reset(torch.arange(num_slots, device=dev, dtype=torch.int32), init.to(dev))
            pools.append(cache)
    tokens = 3 * L
    x0 = torch.randn(tokens, batch, H, P, generator=gen).to(dev, act)
    dts = torch.randn(tokens, layers, batch, H, generator=gen).to(dev, act)
    Bs = (torch.randn(tokens, layers, batch, G, N, generator=gen) / N**0.5).to(dev, act)
    Cs = (torch.randn(tokens, layers, batch, G, N, generator=gen) * 0.5 / N**0.5).to(dev, act)
    # (NaN: an output left unwritten cannot pass, nor one read early from a reused buffer holding an earlier run's bits)
    outs = torch.full((tokens, layers, batch, H, P), float("nan"), dtype=act, device=dev)

    def one_token(pools_, dt_t, B_t, C_t, x_in, out_t):
        x = x_in
        for i in range(layers):
            args = (x, dt_t[i], params[i]["A"], B_t[i], C_t[i])
            kw = dict(slot_ids=slots, D=params[i]["D"], z=x, dt_bias=params[i]["dt_bias"], dt_softplus=True, out=out_t[i])
            if kind == "step":
                replayssm.mamba2_step(pools_[i], *args, **kw)
            else:
                replayssm.mamba2_replay_step(pools_[i], *args, **kw)
            x = out_t[i]

    state = run_chain(monkeypatch, env, one_token, pools, [dts, Bs, Cs, x0], outs, graph)
    return outs, state


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
@pytest.mark.parametrize("kind", ["step", "replay", "view"])
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("layers", [2, 6])
def test_cuda_pdl_launches_give_the_same_bits(monkeypatch, kind, graph, layers):
    """With REPLAYSSM_PDL=1 the decode steps launch with programmatic dependent launch: a layer's kernel may
    start while the one ahead of it (the previous layer, whose output is its x and z) still runs, and must read its
    inputs only after that one has finished; its own cache it reads before (written two launches back with two
    layers, the benchmark's case at large batches). A chain of 2 or 6 layers over 3L tokens (folds included), eager
    and in a CUDA graph, gives the same bits as the plain launches, also with the fold-first order kernel forced
    (the replay step then launches without PDL). (That a launch took the PDL path is not observable here; the
    benchmark's pdl=1 timings show it.)"""
    seed = torch.randint(0, 2**31 - 1, ()).item()
    pdl = {"REPLAYSSM_PDL": "1"}
    extra = ([dict(pdl, REPLAYSSM_TUNE=t) for t in ("replay_fold_first=1", "pdl_ring_ahead=0", "replay_prefetch=0",
                                                    "m2_replay_stage0_first=0", "m2_replay_stage0_first=0,pdl_ring_ahead=0")]
             if kind != "step"
             else [{"REPLAYSSM_TUNE": "step_split_loads=1"}, dict(pdl, REPLAYSSM_TUNE="step_ahead=3"),
                   dict(pdl, REPLAYSSM_TUNE="step_ahead=2,step_unroll=2"),
                   dict(pdl, REPLAYSSM_TUNE="step_ahead=0")])  # (the staged step under PDL)
    envs = [{"REPLAYSSM_PDL": "0"}, pdl] + extra
    assert_chains_agree(lambda env: _pdl_chain(monkeypatch, kind, env, seed, graph, layers), envs)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
@pytest.mark.parametrize("case", [
    dict(H=8, P=64, N=128, G=2, L=16, act=torch.bfloat16),
    dict(H=8, P=64, N=128, G=2, L=32, act=torch.bfloat16),
    dict(H=6, P=64, N=128, G=3, L=2, act=torch.float16),
    dict(H=24, P=32, N=64, G=3, L=5, act=torch.bfloat16),
    dict(H=4, P=48, N=128, G=1, L=7, act=torch.float32),
    dict(H=6, P=16, N=32, G=2, L=3, act=torch.float32),
], ids=lambda c: "H{H}P{P}N{N}G{G}L{L}-{act}".format(**c).replace("torch.", ""))
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("arrive", ["", ",small_arrive=1", ",small_arrive=2"], ids=["arrive-default", "arrive1", "arrive2"])
@pytest.mark.parametrize("align_folds", [True, False], ids=["aligned", "ring-full"])
def test_cuda_small_replay_gives_v10_bits(monkeypatch, case, graph, arrive, align_folds):
    """The small replay-step kernel (csrc/mamba2/replay_small.cuh: grids of at most two blocks per SM, e.g. batches 1-2)
    computes every output, checkpoint row, ring entry and cursor with the same fp32 operations in the same order as
    the general kernel (v10): over 2L + 3 tokens from random cursors (folds at every position of the cycle), with pad
    rows, slots out of order and rings up to its limit of 32, both kernels give the same bits, eager and in a CUDA
    graph, wherever its blocks announce their arrival (small_arrive). (REPLAYSSM_TUNE replay_small=1 forces the small
    kernel, 0 forbids it.)"""
    seed = torch.randint(0, 2**31 - 1, ()).item()
    gen = torch.Generator().manual_seed(seed)
    H, P, N, G, L, act = (case[k] for k in ("H", "P", "N", "G", "L", "act"))
    batch, num_slots, dev = 5, 7, "cuda"
    ids = torch.randperm(num_slots, generator=gen)[:batch].to(torch.int32)
    ids[3] = PAD_SLOT
    ids = ids.to(dev)
    layer = Layer(H, P, G, N, dev, gen)
    cache = Mamba2ReplayCache.allocate(num_slots, H, P, G, N, ring_len=L, act_dtype=act, align_folds=align_folds, device=dev)
    cache.checkpoint.copy_(torch.randn(cache.checkpoint.shape, generator=gen) * 0.5)
    if align_folds:  # (a phase part-way through its cycle)
        cache.fold_phase[0] = int(torch.randint(0, L, (), generator=gen))
    for t in (cache.ring_x, cache.ring_B):
        t.copy_(torch.randn(t.shape, generator=gen))
    cache.ring_dt.copy_(torch.rand(cache.ring_dt.shape, generator=gen) * 0.1)
    cache.cursor.copy_(torch.randint(0, L, (num_slots,), generator=gen, dtype=torch.int32))
    tokens = 2 * L + 3
    inputs = token_inputs(layer, batch, act, gen, tokens, ("x", "dt", "B", "C", "z"))
    outs = torch.full((tokens, batch, H, P), float("nan"), dtype=act, device=dev)

    def one_token(pools, x, dt, B, C, z, out):
        replayssm.mamba2_replay_step(pools[0], x, dt, layer.A, B, C, z=z, slot_ids=ids, out=out, **layer.kwargs())

    def chain(env):
        out = outs.clone()
        state = run_chain(monkeypatch, env, one_token, [clone_cache(cache)], inputs, out, graph)
        return out, state

    want_out, want_state = chain({"REPLAYSSM_TUNE": "replay_small=0"})
    got_out, got_state = chain({"REPLAYSSM_TUNE": "replay_small=1" + arrive})
    assert torch.isnan(want_out[:, 3]).all() and torch.isfinite(want_out[:, [0, 1, 2, 4]].float()).all()
    assert (want_out[:, [0, 1, 2, 4]] != 0).float().mean() > 0.9
    assert torch.equal(got_out.nan_to_num(), want_out.nan_to_num()) and torch.isnan(got_out[:, 3]).all()
    for k in want_state[0]:
        assert torch.equal(got_state[0][k], want_state[0][k]), k
    assert (got_state[0]["arrivals"] == 0).all()
    # (the folds happened: every live slot's cursor moved as the fold rule says, and the phase with them)
    live = ids[[0, 1, 2, 4]].cpu().long()
    model = FoldModel(cache)
    for _ in range(tokens):
        model.step(live.tolist())
    assert got_state[0]["cursor"].cpu()[live].tolist() == [model.cursor[s] for s in live.tolist()]
    if align_folds:
        assert got_state[0]["fold_phase"].tolist() == [model.phase, 0]
    if not graph:  # (the small kernel ran: the comparison above is not the general kernel against itself)
        assert_kernel_ran(monkeypatch, "replay_small=1" + arrive, "mamba2_replay_step_small_kernel",
                          lambda: one_token([clone_cache(cache)], *(x[0] for x in inputs), outs[0].clone()))


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
@pytest.mark.parametrize("value", ["2", "yes", "true"])
def test_cuda_pdl_switch_takes_only_0_or_1(monkeypatch, value):
    """REPLAYSSM_PDL is 0 or 1: any other value is an error that names it, never a silent choice of either."""
    state = torch.zeros(2, 4, 8, 32, device="cuda")
    x, B = torch.randn(1, 4, 8, device="cuda"), torch.randn(1, 2, 32, device="cuda")
    # (dt > 0: the default dt limit clamps at 0, so a normal draw left every head without an update 1 time in 16)
    dt, A = torch.rand(1, 4, device="cuda") + 0.1, -torch.ones(4, device="cuda")
    ids = torch.tensor([1], dtype=torch.int32, device="cuda")
    monkeypatch.setenv("REPLAYSSM_PDL", value)
    with pytest.raises((RuntimeError, ValueError), match="REPLAYSSM_PDL must be 0 or 1"):
        replayssm.mamba2_step(state, x, dt, A, B, B, slot_ids=ids)
    monkeypatch.setenv("REPLAYSSM_PDL", "1")
    out = replayssm.mamba2_step(state, x, dt, A, B, B, slot_ids=ids)  # (and 1 is taken)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all() and state[1].abs().sum() > 0 and not state[0].any()


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
def test_cuda_bad_small_arrive_knob_raises(monkeypatch):
    gen = make_gen()
    layer, cache, tok, ids = _small_args("cuda", gen=gen)  # (fp32, N = 32, headdim 8: a shape the small kernel takes)
    monkeypatch.setenv("REPLAYSSM_TUNE", "replay_small=1,small_arrive=3")
    with pytest.raises(ValueError, match="small_arrive must be 0, 1 or 2"):
        replayssm.mamba2_replay_step(cache, tok["x"], tok["dt"], layer.A, tok["B"], tok["C"], z=tok["z"],
                                     slot_ids=ids, **layer.kwargs())
