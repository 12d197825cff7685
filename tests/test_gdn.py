"""Gated DeltaNet: standard step, replay step, verify/commit and state reads against the float64 delta rule
(../shared/docs/MATH.md, "Gated DeltaNet decode"), on the CPU and, where there is a GPU, with the CUDA kernels."""
import dataclasses
import math

import pytest
import torch

import replayssm
from replayssm import PAD_SLOT, GdnReplayCache
from replayssm import reference as R

from conftest import HAS_CUDA
from helpers import (DTYPES, UNIT_ROUNDOFF, FoldModel, assert_chains_agree, assert_kernel_ran,
                     assert_only_batch_slots_moved, assert_verify_graph_matches_eager, clone_cache, rel_err, run_chain,
                     token_inputs, tolerance)


def make_gen():
    gen = torch.Generator()
    gen.manual_seed(torch.randint(0, 2**31 - 1, ()).item())
    return gen


class GdnLayer:
    """Parameters as trained layers have them: most decays near 1, a few fast heads."""

    def __init__(self, HV, H, K, V, device, gen):
        self.shape = (HV, H, K, V)
        self.A_log = torch.empty(HV).uniform_(0.0, math.log(16.0), generator=gen).to(device)
        dt0 = torch.exp(torch.empty(HV).uniform_(math.log(1e-3), math.log(1e-1), generator=gen))
        self.dt_bias = (dt0 + torch.log(-torch.expm1(-dt0))).to(device)
        self.device = device

    def token(self, batch, dtype, gen, T=None):
        HV, H, K, V = self.shape
        lead = (batch,) if T is None else (batch, T)
        rnd = lambda *s: torch.randn(*lead, *s, generator=gen).to(self.device, dtype)
        return dict(q=rnd(H, K), k=rnd(H, K), v=rnd(HV, V), a=rnd(HV), b=rnd(HV))

    def prepared(self, tok):
        cpu = {k: v.cpu() for k, v in tok.items()}
        return R.gdn_prepare(cpu["q"], cpu["k"], cpu["a"], cpu["b"], self.A_log.cpu(), self.dt_bias.cpu())

    def reference_step(self, state, tok):
        q, k, g, beta = self.prepared(tok)
        return R.gdn_step(state, q, k, tok["v"].cpu(), g, beta)


def test_reference_replay_and_verify_forms_equal_the_delta_rule():
    gen = make_gen()
    HV, H, K, V, w, T = 4, 2, 6, 5, 7, 4
    layer = GdnLayer(HV, H, K, V, "cpu", gen)
    ckpt = torch.randn(2, HV, V, K, generator=gen, dtype=torch.float64)
    state, us, ks, gs = ckpt.clone(), [], [], []
    for _ in range(w):
        tok = layer.token(2, torch.float64, gen)
        q, k, g, beta = layer.prepared(tok)
        o_rep, u, s_rep = R.gdn_replay(ckpt, torch.stack(us, 1) if us else torch.zeros(2, 0, HV, V, dtype=torch.float64),
                                       torch.stack(ks, 1) if ks else torch.zeros(2, 0, H, K, dtype=torch.float64),
                                       torch.stack(gs, 1) if gs else torch.zeros(2, 0, HV, dtype=torch.float64),
                                       q, k, tok["v"], g, beta)
        o_seq, state = R.gdn_step(state, q, k, tok["v"], g, beta)
        assert torch.allclose(o_rep, o_seq, rtol=1e-10, atol=1e-12)
        assert torch.allclose(s_rep, state, rtol=1e-10, atol=1e-12)
        us.append(u), ks.append(k), gs.append(g)
    window = layer.token(2, torch.float64, gen, T=T)
    q, k, g, beta = layer.prepared(window)
    got = R.gdn_verify(state, q, k, window["v"], g, beta)
    want = []
    for t in range(T):
        o, state = R.gdn_step(state, q[:, t], k[:, t], window["v"][:, t], g[:, t], beta[:, t])
        want.append(o)
    assert torch.allclose(got, torch.stack(want, 1), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("act_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("align_folds", [True, False], ids=["aligned", "ring-full"])
def test_step_and_replay_match_the_delta_rule_across_folds(device, act_dtype, state_dtype, align_folds):
    step_and_replay_across_folds(device, act_dtype, state_dtype, align_folds, HV=4, H=2, K=16, V=8, L=5)


@pytest.mark.parametrize("K, V", [(64, 64), (128, 128), (256, 256), (64, 256)], ids=lambda x: str(x))
def test_step_and_replay_at_the_issue_head_sizes(device, K, V):
    """Issue 4's head sizes (K and V of 64, 128 and 256): the standard and replay steps against the float64 delta
    rule across folds, rows at different cursors and a pad row (bf16 activations, fp32 state)."""
    step_and_replay_across_folds(device, torch.bfloat16, torch.float32, True, HV=4, H=2, K=K, V=V, L=4)


def step_and_replay_across_folds(device, act_dtype, state_dtype, align_folds, HV, H, K, V, L):
    gen = make_gen()
    layer = GdnLayer(HV, H, K, V, device, gen)
    batch, num_slots, T = 4, 6, 3 * L + 2
    slots = torch.randperm(num_slots, generator=gen)[:batch]
    init = torch.randn(num_slots, HV, V, K, generator=gen) * 0.3
    pool = init.to(device, state_dtype)
    cache = GdnReplayCache.allocate(num_slots, HV, H, K, V, ring_len=L, checkpoint_dtype=state_dtype, align_folds=align_folds,
                                    device=device)
    cache.checkpoint.copy_(init)
    ref_std = init.to(state_dtype).double()
    ref_rep = ref_std.clone()
    model = FoldModel(cache)
    join_at = [0, 2, 3, -1]  # rows at different cursors; row 3 is a pad row
    tol = tolerance(act_dtype, state_dtype)
    for t in range(T):
        tok = layer.token(batch, act_dtype, gen)
        active = [b for b in range(batch) if join_at[b] >= 0 and t >= join_at[b]]
        ids = torch.full((batch,), PAD_SLOT, dtype=torch.int32)
        ids[active] = slots[active].to(torch.int32)
        ids = ids.to(device)
        out_std = torch.full_like(tok["v"], float("nan"))
        out_rep = torch.full_like(tok["v"], float("nan"))
        replayssm.gdn_step(pool, **tok, A_log=layer.A_log, dt_bias=layer.dt_bias, slot_ids=ids, out=out_std)
        replayssm.gdn_replay_step(cache, **tok, A_log=layer.A_log, dt_bias=layer.dt_bias, slot_ids=ids, out=out_rep)
        sl = slots[active]
        sub = {k: v[active] for k, v in tok.items()}
        y_std, new_std = layer.reference_step(ref_std[sl], sub)
        y_rep, new_rep = layer.reference_step(ref_rep[sl], sub)
        ref_std[sl] = R.round_to(new_std, state_dtype)
        folds = model.step(sl.tolist())
        for i, s in enumerate(sl.tolist()):
            ref_rep[s] = R.round_to(new_rep[i], state_dtype) if folds[s] else new_rep[i]
        assert cache.cursor.cpu()[sl].tolist() == [model.cursor[s] for s in sl.tolist()], t
        assert rel_err(out_std[active], y_std) < tol, t
        assert rel_err(out_rep[active], y_rep) < tol, t
        pad = [b for b in range(batch) if b not in active]
        assert torch.isnan(out_std[pad]).all() and torch.isnan(out_rep[pad]).all()
    sl = slots[[0, 1, 2]]
    state_tol = 4 * UNIT_ROUNDOFF[state_dtype] + 2e-5
    assert rel_err(pool[sl], ref_std[sl]) < state_tol
    assert rel_err(replayssm.gdn_replay_state(cache, sl.to(device, torch.int32)), ref_rep[sl]) < state_tol
    assert torch.equal(pool[slots[3]], init[slots[3]].to(device, state_dtype))  # the pad row's slot is untouched


# Forced launch configurations of the CUDA step and replay step (REPLAYSSM_TUNE, read at every launch; the knobs are
# listed at the top of csrc/gdn/kernels.cuh). "" is the default configuration.
TUNE_CONFIGS = [
    "",  # the step: one-warp blocks of 4 rows at this shape (the 32-row cap acts from batch * HV of about 3 per SM)
    "gdn_step_threads=128",  # the 128-thread step (its default before session 9)
    "gdn_step_rows=64,gdn_step_hints=1",  # one-warp blocks of 64 rows (the default at the benchmark's batch >= 32 until session 16), .cs hints
    "gdn_step_rows=24,gdn_replay_rows=96",  # rows over several blocks; a replay block straddles two value heads
    "gdn_step_rows=16,gdn_step_unroll=1,gdn_replay_rows=36,gdn_replay_prefetch=0",  # scalar v tile, ring after the cursor
    "gdn_step_lanes=32,gdn_step_unroll=8,gdn_step_rows=40,gdn_replay_rows=30,gdn_replay_prefetch=1,gdn_replay_variant=2",
    "gdn_step_lanes=4,gdn_step_unroll=2,gdn_replay_variant=1,gdn_replay_rows=64",
    "gdn_step_lanes=16,gdn_step_bps=64,gdn_replay_variant=0,gdn_replay_bps=64",  # the former 3-stage, 4-lane layout
    "gdn_step_lanes=16,gdn_step_unroll=8,gdn_replay_variant=2,gdn_replay_rows=256",
    "gdn_step_threads=32",  # one-warp blocks, each looping over a head's rows
    "gdn_step_threads=32,gdn_step_rows=12",  # one-warp blocks, rows over several blocks, a partial row group
    "gdn_step_threads=32,gdn_step_unroll=1,gdn_step_rows=4",
    "gdn_step_threads=32,gdn_step_lanes=32,gdn_step_rows=8",  # a row across the warp, 8 rows per block
    "gdn_step_threads=32,gdn_step_lanes=32,gdn_step_unroll=4,gdn_step_rows=20",  # rows over blocks, a partial group
    "gdn_step_ahead=2,gdn_step_rows=32",  # the one-warp step, the next row iterations' state in flight (cp.async)
    "gdn_step_ahead=3,gdn_step_rows=12",  # staged, a partial row group
    "fold_pair=1",  # the replay step's folds two row iterations per trip (the default since session 37)
    "fold_pair=0",  # one row iteration per trip (the default before session 37 at one resident wave, as here)
    "fold_pair=0,gdn_replay_rows=48,gdn_replay_variant=2",
    "fold_pair=1,gdn_replay_rows=36,gdn_replay_variant=2",
    "gdn_replay_split=0,gdn_replay_bps=64",  # the replay step's rows as the block split gives them (uneven blocks)
    "stream_lean=0",  # the replay step's row copies from 64-bit addresses (a plain one-wave grid's default before s39)
    "stream_lean=1",  # from 32-bit offsets (the default wherever they fit)
    "stream_lean=1,fold_pair=1,gdn_replay_rows=48",
    "stream_lean=0,fold_pair=1,gdn_replay_rows=48,gdn_replay_variant=0",
    "replay_stage0_first=0,gdn_replay_rows=64",  # the replay prologue waits for every first stage (before session 35)
    "replay_stage0_first=1,fold_pair=1,gdn_replay_rows=120,gdn_replay_prefetch=0",  # across a value head's end
    "replay_stage0_first=0,gdn_replay_variant=0,gdn_replay_rows=40",  # 3 stages: one issued after the ring
    "gdn_replay_bps=16,replay_stage0_first=0",  # a plain cache's split of sessions 35-48, the prologue before 35
]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [0, 32, 12, 44, 64, 128], ids=lambda r: f"rows{r}")
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_cuda_staged_step_gives_the_same_bits(monkeypatch, rows, graph):
    """gdn_step with the state of the next 1-3 row iterations in flight (REPLAYSSM_TUNE gdn_step_ahead=1..4: cp.async
    into shared-memory stages, v an iteration ahead) runs the same fp32 operations in the same order as the one-warp
    default (gdn_step_ahead=0): over several tokens, with the rows a block gets (8 rows an iteration): this batch's
    default split (4 rows: one half-masked iteration), 32 (the benchmark's blocks: 4 iterations), 12 (a partial
    second one), 44 (6, the last partial after the stages wrapped), 64 (8) and 128 (a head in one block: 16),
    outputs and states are the same bits, eager and in a CUDA graph."""
    gen = make_gen()
    HV, H, K, V, batch, num_slots, tokens = 4, 2, 128, 128, 3, 5, 4
    layer = GdnLayer(HV, H, K, V, "cuda", gen)
    ids = torch.randperm(num_slots, generator=gen)[:batch].to(torch.int32).cuda()
    pool = (torch.randn(num_slots, HV, V, K, generator=gen) * 0.1).cuda()
    inputs = token_inputs(layer, batch, torch.bfloat16, gen, tokens, ("q", "k", "v", "a", "b"))
    outs = torch.zeros((tokens, batch, HV, V), dtype=torch.bfloat16, device="cuda")

    def one_token(pools, q, k, v, a, b, out):
        replayssm.gdn_step(pools[0], q, k, v, a, b, layer.A_log, slot_ids=ids, dt_bias=layer.dt_bias, out=out)

    def chain(env):
        out = outs.clone()
        return out, run_chain(monkeypatch, env, one_token, [pool.clone()], inputs, out, graph)

    forced = f",gdn_step_rows={rows}" if rows else ""
    runs = assert_chains_agree(chain, [{"REPLAYSSM_TUNE": f"gdn_step_ahead={a}{forced}"} for a in (0, 1, 2, 3, 4)])
    assert_only_batch_slots_moved(runs[1][0], pool, ids)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("tune", TUNE_CONFIGS)
def test_cuda_launch_configurations_match_the_delta_rule(monkeypatch, tune):
    """The CUDA gdn_step and gdn_replay_step at the benchmark's shape per head (K = V = 128, fp32 state, bf16
    activations) under forced launch configurations: a head's rows split over several blocks, blocks straddling value
    heads, partial row groups, scalar tile copies, the ring fetched before or after the cursor, every pipeline
    variant; rows at different cursors across folds and a pad row. Outputs and states against the float64 delta rule;
    cursors as the CPU advances them and arrival counters back at zero after every step."""
    monkeypatch.setenv("REPLAYSSM_TUNE", tune)
    gen = make_gen()
    HV, H, K, V, L = 4, 2, 128, 128, 4
    layer = GdnLayer(HV, H, K, V, "cuda", gen)
    batch, num_slots, T = 4, 5, 2 * L + 2
    slots = torch.randperm(num_slots, generator=gen)[:batch]
    init = torch.randn(num_slots, HV, V, K, generator=gen) * 0.1
    pool = init.cuda()
    cache = GdnReplayCache.allocate(num_slots, HV, H, K, V, ring_len=L, device="cuda")
    cache.checkpoint.copy_(init)
    ref_std, ref_rep = init.double(), init.double()
    model = FoldModel(cache)
    join_at = [0, 1, 3, -1]  # rows at different cursors; row 3 is a pad row
    tol = tolerance(torch.bfloat16, torch.float32)
    for t in range(T):
        tok = layer.token(batch, torch.bfloat16, gen)
        active = [b for b in range(batch) if join_at[b] >= 0 and t >= join_at[b]]
        ids = torch.full((batch,), PAD_SLOT, dtype=torch.int32)
        ids[active] = slots[active].to(torch.int32)
        ids = ids.cuda()
        out_std = torch.full_like(tok["v"], float("nan"))
        out_rep = torch.full_like(tok["v"], float("nan"))
        replayssm.gdn_step(pool, **tok, A_log=layer.A_log, dt_bias=layer.dt_bias, slot_ids=ids, out=out_std)
        replayssm.gdn_replay_step(cache, **tok, A_log=layer.A_log, dt_bias=layer.dt_bias, slot_ids=ids, out=out_rep)
        sl = slots[active]
        sub = {k: v[active] for k, v in tok.items()}
        y_std, new_std = layer.reference_step(ref_std[sl], sub)
        y_rep, new_rep = layer.reference_step(ref_rep[sl], sub)
        ref_std[sl] = new_std
        ref_rep[sl] = new_rep
        model.step(sl.tolist())
        assert rel_err(out_std[active], y_std) < tol, (t, tune)
        assert rel_err(out_rep[active], y_rep) < tol, (t, tune)
        assert torch.isnan(out_std[3]).all() and torch.isnan(out_rep[3]).all()
        assert cache.cursor.cpu().tolist() == model.cursor, (t, tune)
        assert cache.fold_phase.tolist() == [model.phase, 0], (t, tune)
        assert not cache.arrivals.any(), (t, tune)
    sl = slots[[0, 1, 2]]
    state_tol = 4 * UNIT_ROUNDOFF[torch.float32] + 2e-5
    assert rel_err(pool[sl], ref_std[sl]) < state_tol
    assert rel_err(replayssm.gdn_replay_state(cache, sl.to("cuda", torch.int32)), ref_rep[sl]) < state_tol
    assert torch.equal(pool[slots[3]].cpu(), init[slots[3]])  # the pad row's slot is untouched
    assert torch.equal(cache.checkpoint[slots[3]].cpu(), init[slots[3]])


# CUDA verify launch configurations (REPLAYSSM_TUNE): gdn_verify_rows counts rows of a key head's value heads per
# block. K = 16: one lane per row, the reduce-scatter in rounds of one sum.
VERIFY_TUNES = {
    "default": "",
    "rows-over-blocks": "gdn_verify_rows=3",  # blocks straddle value heads
    "rows-12": "gdn_verify_rows=12",
}


VERIFY_CASES = [pytest.param("cpu", "", id="cpu")] + [
    pytest.param("cuda", tune, id=f"cuda-{name}", marks=[pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")])
    for name, tune in VERIFY_TUNES.items()]


@pytest.mark.parametrize("device, tune", VERIFY_CASES)
def test_verify_commit_property_over_many_steps(device, tune, monkeypatch):
    """Random windows and accepted counts with early folds: every tentative output, every committed state and the
    state at a random committed position since the last fold (gdn_materialize) equal the float64 delta rule over the
    accepted tokens; the checkpoint is written only when a window did not fit. On CUDA also with a key head's rows
    split over blocks in other ways (REPLAYSSM_TUNE)."""
    monkeypatch.setenv("REPLAYSSM_TUNE", tune)
    verify_property(device, HV=4, H=2, K=16, V=8, history=4, T=3, steps=60)


@pytest.mark.parametrize("K, V", [(64, 64), (128, 128), (256, 256)], ids=lambda x: str(x))
def test_verify_at_the_issue_head_sizes(device, K, V):
    """Issue 4's head sizes: verify + commit, the same property as above over fewer steps (fp32 activations)."""
    verify_property(device, HV=4, H=2, K=K, V=V, history=4, T=3, steps=16)


def verify_property(device, HV, H, K, V, history, T, steps):
    gen = make_gen()
    L = history + T
    layer = GdnLayer(HV, H, K, V, device, gen)
    batch, num_slots = 3, 5
    slots = torch.randperm(num_slots, generator=gen)[:batch]
    cache = GdnReplayCache.allocate(num_slots, HV, H, K, V, ring_len=L, device=device)
    init = torch.randn(batch, HV, V, K, generator=gen) * 0.3
    cache.reset(slots.to(device), init.to(device))
    ref = {s: init[b].double() for b, s in enumerate(slots.tolist())}
    cursor = {s: 0 for s in slots.tolist()}
    since_fold = {s: [ref[s]] for s in slots.tolist()}  # the reference state at each committed position
    folds = 0
    for step in range(steps):
        ids = slots.to(device, torch.int32)
        n_tok = torch.randint(1, T + 1, (batch,), generator=gen, dtype=torch.int32)
        tok = layer.token(batch, torch.float32, gen, T=T)
        out = torch.full_like(tok["v"], float("nan"))
        before = cache.checkpoint.clone()
        replayssm.gdn_replay_verify(cache, **tok, A_log=layer.A_log, dt_bias=layer.dt_bias, slot_ids=ids,
                                    num_tokens=n_tok.to(device), out=out)
        assert not cache.arrivals.any()
        accepted = torch.zeros(batch, dtype=torch.int32)
        for b, s in enumerate(slots.tolist()):
            nb = n_tok[b].item()
            fold = cursor[s] + nb > L
            assert torch.equal(cache.checkpoint[s], before[s]) != fold
            folds += fold
            if fold:
                cursor[s], since_fold[s] = 0, [ref[s]]
            state, states = ref[s][None], []
            for t in range(nb):
                o, state = layer.reference_step(state, {k: v[b:b + 1, t] for k, v in tok.items()})
                states.append(state[0])
                assert rel_err(out[b, t], o[0]) < tolerance(torch.float32, torch.float32), (step, b, t)
            n_acc = torch.randint(1, nb + 1, (), generator=gen).item()
            accepted[b] = n_acc
            ref[s] = states[n_acc - 1]
            since_fold[s] += states[:n_acc]
            cursor[s] += n_acc
        replayssm.gdn_replay_commit(cache, ids, accepted.to(device))
        assert cache.cursor.cpu()[slots].tolist() == [cursor[s] for s in slots.tolist()]
        got = replayssm.gdn_replay_state(cache, ids)
        assert rel_err(got, torch.stack([ref[s] for s in slots.tolist()])) < tolerance(torch.float32, torch.float32)
        pos = [torch.randint(0, cursor[s] + 1, (), generator=gen).item() for s in slots.tolist()]
        got = replayssm.gdn_materialize(cache, ids, positions=torch.tensor(pos, dtype=torch.int32, device=device))
        want = torch.stack([since_fold[s][p] for s, p in zip(slots.tolist(), pos)])
        assert rel_err(got, want) < tolerance(torch.float32, torch.float32), (step, pos)
    assert folds > steps // 12  # (each row folds about one step in five here: ~10 folds in 16 steps of 3 rows)


# The verify kernel at the benchmark's shape per head (K = V = 128, fp32 checkpoint, bf16 activations).
VERIFY_TUNES_K128 = {
    "default": "",  # the fewest rows a block takes at this batch: one 64-row tile (16 with gdn_verify_mma=0)
    "rows-48": "gdn_verify_rows=48",
    "rows-96": "gdn_verify_rows=96",  # a block straddles two value heads; a partial last block
    "rows-30": "gdn_verify_rows=30",  # partial row iterations, scalar ring-u tile
    "whole-key-head": "gdn_verify_rows=256",  # four 64-row tiles (two row passes a thread with gdn_verify_mma=0)
    "cuda-cores": "gdn_verify_mma=0",  # the row loop's dots on the CUDA cores (the default: tensor cores, 3xTF32)
    "cuda-cores-rows-30": "gdn_verify_mma=0,gdn_verify_rows=30",
    "cuda-cores-rows-96": "gdn_verify_mma=0,gdn_verify_rows=96",
}


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("tune", list(VERIFY_TUNES_K128.values()), ids=list(VERIFY_TUNES_K128))
def test_cuda_verify_launch_configurations_match_the_delta_rule(monkeypatch, tune):
    """gdn_replay_verify + commit at K = V = 128 with bf16 activations under forced launch configurations (a key
    head's rows over several blocks, blocks straddling value heads, partial iterations) and with either row loop
    (tensor cores, CUDA cores): random windows (num_tokens 1..T), random accepted counts, early folds and a pad row.
    Every tentative output against the float64 delta rule; the checkpoint written exactly when a window did not fit;
    cursors, pending counts and arrival counters as the protocol leaves them; the committed states
    (gdn_replay_state) against the reference."""
    verify_against_the_delta_rule(monkeypatch, tune, HV=4, H=2, K=128, V=128, history=5, T=6)  # T = 6: 4 tokens, then 2


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("K, V, T", [(32, 48, 9), (64, 32, 16), (256, 16, 3)], ids=["K32-T9", "K64-T16", "K256-T3"])
def test_cuda_verify_tensor_core_dots_at_other_shapes(monkeypatch, K, V, T):
    """The tensor-core row loop's other key dims (one, two and eight 32-column iterations a row tile) and token
    counts (three and four n tiles of 4 tokens, one partial; T = 3: one partial), against the float64 delta rule as
    in the K = 128 test; V = 48 leaves the last 64-row tile of a key head partly empty."""
    verify_against_the_delta_rule(monkeypatch, "", HV=4, H=2, K=K, V=V, history=4, T=T)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_verify_early_fold_is_the_same_in_both_row_loops(monkeypatch):
    """An early fold forms the same checkpoint, bit for bit, in the tensor-core row loop and in the CUDA-core one
    (gdn_verify_mma=0): the same fp32 operations per element in the same order. From one cache state (a committed
    history built by verifies and commits), the same folding verify runs on two copies of it, one with each loop.
    (Only the fold is compared: the loops' dots, and so the corrections u they write, differ in their last bits.)"""
    gen = make_gen()
    HV, H, K, V, T, L = 4, 2, 128, 128, 4, 8
    layer = GdnLayer(HV, H, K, V, "cuda", gen)
    batch = 3
    ids = torch.arange(batch, dtype=torch.int32, device="cuda")
    cache = GdnReplayCache.allocate(batch, HV, H, K, V, ring_len=L, device="cuda")
    cache.checkpoint.copy_(torch.randn(batch, HV, V, K, generator=gen) * 0.1)
    for _ in range(2):  # cursors 0 -> 3 -> 6: the next window of 4 does not fit a ring of 8
        tok = layer.token(batch, torch.bfloat16, gen, T=T)
        replayssm.gdn_replay_verify(cache, **tok, A_log=layer.A_log, dt_bias=layer.dt_bias, slot_ids=ids)
        replayssm.mamba2_replay_commit(cache, ids, torch.full((batch,), 3, dtype=torch.int32, device="cuda"))
    assert (cache.cursor == 6).all()
    other = dataclasses.replace(cache, **{f.name: getattr(cache, f.name).clone() for f in dataclasses.fields(cache)
                                          if isinstance(getattr(cache, f.name), torch.Tensor)})
    before = cache.checkpoint.clone()
    tok = layer.token(batch, torch.bfloat16, gen, T=T)
    for c, tune in ((cache, ""), (other, "gdn_verify_mma=0")):
        monkeypatch.setenv("REPLAYSSM_TUNE", tune)
        replayssm.gdn_replay_verify(c, **tok, A_log=layer.A_log, dt_bias=layer.dt_bias, slot_ids=ids)
    assert (cache.cursor == 0).all() and (other.cursor == 0).all()  # both folded
    assert not torch.equal(cache.checkpoint, before)
    assert torch.equal(cache.checkpoint, other.checkpoint)


def verify_against_the_delta_rule(monkeypatch, tune, HV, H, K, V, history, T):
    monkeypatch.setenv("REPLAYSSM_TUNE", tune)
    gen = make_gen()
    L = history + T
    layer = GdnLayer(HV, H, K, V, "cuda", gen)
    batch, num_slots = 4, 5
    slots = torch.randperm(num_slots, generator=gen)[:batch]
    cache = GdnReplayCache.allocate(num_slots, HV, H, K, V, ring_len=L, device="cuda")
    init = torch.randn(num_slots, HV, V, K, generator=gen) * 0.1
    cache.checkpoint.copy_(init)
    live = slots[:3].tolist()  # row 3 is a pad row
    ref = {s: init[s].double() for s in live}
    cursor = {s: 0 for s in live}
    ids = torch.tensor(live + [PAD_SLOT], dtype=torch.int32, device="cuda")
    tol = tolerance(torch.bfloat16, torch.float32)
    folds = 0
    for step in range(14):
        n_tok = torch.randint(1, T + 1, (batch,), generator=gen, dtype=torch.int32)
        if step == 0:
            n_tok[:] = T
        tok = layer.token(batch, torch.bfloat16, gen, T=T)
        out = torch.full_like(tok["v"], float("nan"))
        before = cache.checkpoint.clone()
        replayssm.gdn_replay_verify(cache, **tok, A_log=layer.A_log, dt_bias=layer.dt_bias, slot_ids=ids,
                                    num_tokens=n_tok.cuda(), out=out)
        assert not cache.arrivals.any(), (step, tune)
        assert torch.isnan(out[3]).all()
        accepted = torch.zeros(batch, dtype=torch.int32)
        for b, s in enumerate(live):
            nb = n_tok[b].item()
            fold = cursor[s] + nb > L
            assert torch.equal(cache.checkpoint[s], before[s]) != fold, (step, b, tune)
            folds += fold
            cursor[s] = 0 if fold else cursor[s]
            assert cache.cursor[s].item() == cursor[s] and cache.pending[s].item() == nb, (step, b, tune)
            state, states = ref[s][None], []
            for t in range(nb):
                o, state = layer.reference_step(state, {k: v[b:b + 1, t] for k, v in tok.items()})
                states.append(state[0])
                assert rel_err(out[b, t], o[0]) < tol, (step, b, t, tune)
            assert torch.isnan(out[b, nb:]).all()
            n_acc = torch.randint(1, nb + 1, (), generator=gen).item()
            accepted[b] = n_acc
            ref[s] = states[n_acc - 1]
            cursor[s] += n_acc
        replayssm.mamba2_replay_commit(cache, ids, accepted.cuda())
        got = replayssm.gdn_replay_state(cache, ids[:3])
        assert rel_err(got, torch.stack([ref[s] for s in live])) < 4 * UNIT_ROUNDOFF[torch.float32] + 2e-5, (step, tune)
    assert folds >= 3
    pad_slot = slots[3].item()
    assert torch.equal(cache.checkpoint[pad_slot].cpu(), init[pad_slot])  # the pad row's slot is untouched
    assert cache.cursor[pad_slot].item() == 0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("tune", ["", "gdn_verify_rows=96", "gdn_verify_mma=0"], ids=["default", "rows-96", "cuda-cores"])
def test_cuda_verify_on_a_strided_checkpoint_equals_the_contiguous_one(monkeypatch, tune):
    """A checkpoint whose value heads are not V rows apart (a slice of a pool with spare rows per head: the row-pass
    kernel then addresses a row by (value head, row) instead of one multiply) gives, bit for bit, the outputs, ring,
    cursors, pending counts and checkpoint of the same verifies and commits on a contiguous copy, early folds
    included; the spare rows are never touched."""
    monkeypatch.setenv("REPLAYSSM_TUNE", tune)
    gen = make_gen()
    HV, H, K, V, history, T = 4, 2, 128, 128, 5, 6
    L = history + T
    layer = GdnLayer(HV, H, K, V, "cuda", gen)
    batch = 3
    ids = torch.arange(batch, dtype=torch.int32, device="cuda")
    dense = GdnReplayCache.allocate(batch, HV, H, K, V, ring_len=L, device="cuda")
    dense.checkpoint.copy_(torch.randn(batch, HV, V, K, generator=gen) * 0.1)
    pool = torch.full((batch, HV, V + 8, K), float("nan"), device="cuda")
    pool[:, :, :V] = dense.checkpoint
    strided = dataclasses.replace(dense, checkpoint=pool[:, :, :V], **{f: getattr(dense, f).clone() for f in
                                                                         ("ring_u", "ring_k", "ring_g", "cursor", "arrivals", "pending")})
    same = lambda a, b: torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    folds = 0
    for step in range(12):
        n_tok = torch.randint(1, T + 1, (batch,), generator=gen, dtype=torch.int32).cuda()
        tok = layer.token(batch, torch.bfloat16, gen, T=T)
        outs = []
        for cache in (dense, strided):
            out = torch.full_like(tok["v"], float("nan"))
            replayssm.gdn_replay_verify(cache, **tok, A_log=layer.A_log, dt_bias=layer.dt_bias, slot_ids=ids,
                                        num_tokens=n_tok, out=out)
            outs.append(out)
        folds += int((dense.cursor == 0).sum()) if step else 0  # (after step 0 a cursor is 0 only after an early fold)
        same(outs[0], outs[1])
        for f in ("checkpoint", "ring_u", "ring_k", "ring_g", "cursor", "pending", "arrivals"):
            same(getattr(dense, f), getattr(strided, f))
        accepted = torch.stack([torch.randint(1, int(n) + 1, (), generator=gen) for n in n_tok.cpu()]).to("cuda", torch.int32)
        for cache in (dense, strided):
            replayssm.mamba2_replay_commit(cache, ids, accepted)
    assert folds > 0
    assert torch.isnan(pool[:, :, V:]).all()


def test_greedy_speculative_decoding_gives_the_tokens_of_plain_decoding(device):
    """A toy language model around one GDN layer: greedy decoding with gdn_step, and speculative decoding (drafts from a
    noisy copy of the greedy sequence, gdn_replay_verify, the matching prefix accepted, gdn_replay_commit) produce
    exactly the same tokens, and speculation accepts several tokens a call."""
    gen = make_gen()
    HV, H, K, Vd, vocab, T, d = 4, 2, 16, 8, 23, 4, 24
    layer = GdnLayer(HV, H, K, Vd, device, gen)
    E = torch.randn(vocab, d, generator=gen).to(device)
    W = {name: (torch.randn(d, n, generator=gen) / d**0.5).to(device)
         for name, n in (("q", H * K), ("k", H * K), ("v", HV * Vd), ("a", HV), ("b", HV))}
    W_out = torch.randn(HV * Vd, vocab, generator=gen).to(device)
    shapes = {"q": (H, K), "k": (H, K), "v": (HV, Vd), "a": (HV,), "b": (HV,)}

    def embed(tok_ids):  # (1, t) -> per-token inputs (1, t, ...)
        u = E[tok_ids]
        return {name: (u @ W[name]).view(1, tok_ids.shape[1], *shapes[name]) for name in W}

    steps, start = 40, torch.tensor([[3]], device=device)
    ids = torch.tensor([0], dtype=torch.int32, device=device)
    kw = dict(A_log=layer.A_log, dt_bias=layer.dt_bias, slot_ids=ids)
    state = torch.zeros(1, HV, Vd, K, device=device)
    plain, last = [], start
    for _ in range(steps):
        y = replayssm.gdn_step(state, **{k: v[:, 0] for k, v in embed(last).items()}, **kw)
        last = (y.reshape(1, -1) @ W_out).argmax(-1, keepdim=True)
        plain.append(last.item())

    cache = GdnReplayCache.allocate(1, HV, H, K, Vd, ring_len=8 + T, device=device)
    spec, last, calls = [], start, 0
    while len(spec) < steps:
        n = len(spec)  # drafts: the next greedy tokens, each replaced by a random one with probability 0.4
        drafts = [plain[n + j] if n + j < steps and torch.rand((), generator=gen) > 0.4
                  else torch.randint(0, vocab, (), generator=gen).item() for j in range(T - 1)]
        y = replayssm.gdn_replay_verify(cache, **embed(torch.cat([last, torch.tensor([drafts], device=device)], 1)), **kw)
        target = (y.reshape(1, T, -1) @ W_out).argmax(-1)[0].tolist()  # the greedy token after each window token
        n_acc = 1
        while n_acc < T and drafts[n_acc - 1] == target[n_acc - 1]:
            n_acc += 1
        replayssm.gdn_replay_commit(cache, ids, torch.tensor([n_acc], dtype=torch.int32, device=device))
        spec += target[:n_acc]
        calls += 1
        last = torch.tensor([[spec[-1]]], device=device)
    assert spec[:steps] == plain
    assert calls < 0.75 * steps, calls  # (~2.2 tokens a call: ~18 calls; one a call would take 40)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_of_verify_and_commit_matches_eager():
    """gdn_replay_verify + gdn_replay_commit captured once in a CUDA graph and replayed with new tokens, window sizes
    and accepted counts each time (written into the captured tensors) give what eager launches give, bit for bit,
    across early folds; a pad row stays untouched."""
    gen = make_gen()
    HV, H, K, V, T, L = 4, 2, 128, 128, 3, 8
    layer = GdnLayer(HV, H, K, V, "cuda", gen)
    ids = torch.tensor([3, PAD_SLOT, 0], dtype=torch.int32, device="cuda")
    eager = GdnReplayCache.allocate(5, HV, H, K, V, ring_len=L, device="cuda")
    eager.checkpoint.copy_(torch.randn(eager.checkpoint.shape, generator=gen) * 0.3)

    def step(cache, tok, out, n_tok, accepted):
        replayssm.gdn_replay_verify(cache, **tok, A_log=layer.A_log, dt_bias=layer.dt_bias, slot_ids=ids, num_tokens=n_tok,
                                    out=out)
        replayssm.gdn_replay_commit(cache, ids, accepted)

    assert_verify_graph_matches_eager(step, eager, lambda: layer.token(3, torch.bfloat16, gen, T=T), "v",
                                      ("checkpoint", "ring_u", "ring_k", "ring_g", "cursor", "arrivals", "pending"), T, L, gen)


def test_torch_compile_fullgraph(device):
    """gdn_replay_step, and gdn_replay_verify followed by commit, under torch.compile(fullgraph=True) give what eager
    calls give on a twin cache, bit for bit, over more than a ring's worth of steps (folds included)."""
    gen = make_gen()
    HV, H, K, V, L, T = 4, 2, 16, 8, 4, 2
    layer = GdnLayer(HV, H, K, V, device, gen)
    cache = GdnReplayCache.allocate(3, HV, H, K, V, ring_len=L, device=device)
    cache.checkpoint.copy_(torch.randn(cache.checkpoint.shape, generator=gen) * 0.3)
    twin = clone_cache(cache)
    ids = torch.tensor([2, 0], dtype=torch.int32, device=device)
    tensors = lambda c: (c.checkpoint, c.ring_u, c.ring_k, c.ring_g, c.cursor, c.arrivals, c.pending, c.fold_phase)
    scale = K**-0.5

    def step(ck, ru, rk, rg, cur, arr, pending, phase, q, k, v, a, b, out):
        torch.ops.replayssm.gdn_replay_step(ck, ru, rk, rg, cur, arr, q, k, v, a, b, layer.A_log, layer.dt_bias, True, scale,
                                            ids, out, None, None, None, phase)
        return out * 2

    def verify(ck, ru, rk, rg, cur, arr, pending, phase, q, k, v, a, b, out, accepted):
        torch.ops.replayssm.gdn_replay_verify(ck, ru, rk, rg, cur, q, k, v, a, b, layer.A_log, layer.dt_bias, True, scale,
                                              ids, None, out, pending, arr, None, None, None)
        torch.ops.replayssm.mamba2_replay_commit(cur, L, ids, accepted, pending)
        return out * 2

    compiled_step = torch.compile(step, fullgraph=True, dynamic=False)
    for _ in range(L + 2):
        tok = layer.token(2, torch.float32, gen)
        got = compiled_step(*tensors(cache), *tok.values(), torch.empty_like(tok["v"]))
        want = step(*tensors(twin), *tok.values(), torch.empty_like(tok["v"]))
        assert torch.equal(got, want)
    compiled_verify = torch.compile(verify, fullgraph=True, dynamic=False)
    accepted = torch.ones(2, dtype=torch.int32, device=device)
    for _ in range(L + 2):
        tok = layer.token(2, torch.float32, gen, T=T)
        got = compiled_verify(*tensors(cache), *tok.values(), torch.empty_like(tok["v"]), accepted)
        want = verify(*tensors(twin), *tok.values(), torch.empty_like(tok["v"]), accepted)
        assert torch.equal(got, want)
    for name, a in vars(cache).items():
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, getattr(twin, name)), name


def test_opcheck_and_bad_inputs():
    gen = make_gen()
    HV, H, K, V = 4, 2, 8, 8
    layer = GdnLayer(HV, H, K, V, "cpu", gen)
    cache = GdnReplayCache.allocate(3, HV, H, K, V, ring_len=4)
    ids = torch.tensor([2, 0], dtype=torch.int32)
    tok = layer.token(2, torch.float32, gen)
    args = (tok["q"], tok["k"], tok["v"], tok["a"], tok["b"], layer.A_log, layer.dt_bias, True, K ** -0.5, ids)
    torch.library.opcheck(torch.ops.replayssm.gdn_step.default, (torch.randn(3, HV, V, K),) + args + (torch.empty_like(tok["v"]),))
    torch.library.opcheck(torch.ops.replayssm.gdn_replay_step.default,
                          (cache.checkpoint, cache.ring_u, cache.ring_k, cache.ring_g, cache.cursor, cache.arrivals) + args
                          + (torch.empty_like(tok["v"]),))
    win = layer.token(2, torch.float32, gen, T=2)
    torch.library.opcheck(torch.ops.replayssm.gdn_replay_verify.default,
                          (cache.checkpoint, cache.ring_u, cache.ring_k, cache.ring_g, cache.cursor, win["q"], win["k"],
                           win["v"], win["a"], win["b"], layer.A_log, layer.dt_bias, True, K ** -0.5, ids, None,
                           torch.empty_like(win["v"])))
    for kw in (dict(output_view=torch.bfloat16), dict(checkpoint_dtype=torch.bfloat16, rounding="stochastic", seed=5)):
        split = GdnReplayCache.allocate(3, HV, H, K, V, ring_len=4, **kw)
        split.cursor.fill_(3)  # a window of 2 does not fit: an early fold writes checkpoint, view and fold count
        torch.library.opcheck(torch.ops.replayssm.gdn_replay_verify.default,
                              (split.checkpoint, split.ring_u, split.ring_k, split.ring_g, split.cursor, win["q"], win["k"],
                               win["v"], win["a"], win["b"], layer.A_log, layer.dt_bias, True, K ** -0.5, ids, None,
                               torch.empty_like(win["v"]), split.pending, split.arrivals, split.view, split.sr_seed,
                               split.fold_count))
    torch.library.opcheck(torch.ops.replayssm.gdn_replay_state.default,
                          (cache.checkpoint, cache.ring_u, cache.ring_k, cache.ring_g, cache.cursor, ids, None,
                           torch.empty(2, HV, V, K)))
    with pytest.raises(ValueError, match=r"k must have shape \(2, 2, 8\)"):
        replayssm.gdn_step(torch.randn(3, HV, V, K), **dict(tok, k=tok["k"][:, :, :4]), A_log=layer.A_log, slot_ids=ids)
    with pytest.raises(ValueError, match=r"state must have shape \(\*, 4, 4, 8\)"):
        replayssm.gdn_step(torch.randn(3, HV, V, K), **dict(tok, v=tok["v"][:, :, :4]), A_log=layer.A_log, slot_ids=ids)
    with pytest.raises(ValueError, match="multiple of key heads"):
        replayssm.gdn_step(torch.randn(3, 3, V, K), **dict(tok, v=torch.randn(2, 3, V), a=torch.randn(2, 3),
                                                          b=torch.randn(2, 3)), A_log=torch.randn(3), slot_ids=ids)
    with pytest.raises(ValueError, match="A_log must have dtype Float"):
        replayssm.gdn_step(torch.randn(3, HV, V, K), **tok, A_log=layer.A_log.double(), slot_ids=ids)
    with pytest.raises(IndexError, match=r"slot_ids\[0\] = 5 is out of range"):
        replayssm.gdn_replay_step(cache, **tok, A_log=layer.A_log, slot_ids=torch.tensor([5, 0], dtype=torch.int32))


def load_fla():
    """fla's Triton kernels (an optional test dependency: third_party/get_baselines.sh fetches them)."""
    import os
    import sys
    path = os.path.join(os.path.dirname(__file__), "..", "third_party", ".cache", "fla")
    sys.path.insert(0, os.path.abspath(path))
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    except Exception:  # noqa: BLE001 (absent, or not importable on this machine)
        return None
    return fused_recurrent_gated_delta_rule, chunk_gated_delta_rule


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_kernels_match_fla():
    """gdn_step over T tokens, and gdn_replay_verify over the same T tokens at once, against fla's fused recurrent
    and chunked kernels on the same bf16 inputs (g and beta formed outside, as the model does): the same outputs
    to bf16 accuracy and the same final state to fp32 accuracy (fla's chunked form rounds more)."""
    fla = load_fla()
    if fla is None:
        pytest.skip("fla is not available (third_party/get_baselines.sh fetches it)")
    fused, chunk = fla
    gen = make_gen()
    B, T, HV, H, K, V = 3, 8, 8, 4, 128, 128
    rnd = lambda *s: torch.randn(*s, generator=gen).to("cuda", torch.bfloat16)
    q, k, v, a, b = rnd(B, T, H, K), rnd(B, T, H, K), rnd(B, T, HV, V), rnd(B, T, HV), rnd(B, T, HV)
    A_log = (torch.rand(HV, generator=gen) * math.log(16.0)).cuda()
    dt_bias = (torch.rand(HV, generator=gen) - 4.0).cuda()
    init = (torch.randn(B, HV, V, K, generator=gen) * 0.1).cuda()
    g = -torch.exp(A_log) * torch.nn.functional.softplus(a.float() + dt_bias)
    beta = torch.sigmoid(b.float())
    slots = torch.arange(B, dtype=torch.int32, device="cuda")

    state = init.clone()
    ours = torch.stack([replayssm.gdn_step(state, q[:, t], k[:, t], v[:, t], a[:, t], b[:, t], A_log, slot_ids=slots,
                                           dt_bias=dt_bias) for t in range(T)], 1)
    o_fr, s_fr = fused(q, k, v, g=g, beta=beta, initial_state=init.clone(), output_final_state=True,
                       use_qk_l2norm_in_kernel=True, state_v_first=True)
    # Bounds: both outputs are rounded to bf16 (half a unit each, 2^-9), and fla's kernels round more operands to bf16
    # on the way (normalised q and k, the chunked form's intra-chunk products): 2e-2 is ~5 bf16 units, while a wrong
    # recurrence (a token's update dropped, a decay skipped) errs by 1e-1 to 1 at these shapes. The fused kernel keeps
    # its state in fp32: 8 tokens of K = 128 dot products in another order stay under 1e-4; the chunked form's state is
    # formed from bf16-rounded operands (a few units of 2^-9, normwise under 1e-2).
    assert rel_err(ours, o_fr.double()) < 2e-2
    assert rel_err(state, s_fr.double()) < 1e-4
    ratio = HV // H
    o_ch, s_ch = chunk(q.repeat_interleave(ratio, 2), k.repeat_interleave(ratio, 2), v, g=g, beta=beta,
                       initial_state=init.clone(), output_final_state=True, use_qk_l2norm_in_kernel=True, state_v_first=True)
    assert rel_err(ours, o_ch.double()) < 2e-2
    assert rel_err(state, s_ch.double()) < 1e-2

    cache = GdnReplayCache.allocate(B, HV, H, K, V, ring_len=T + 4, device="cuda")
    cache.reset(slots, init)
    o_v = replayssm.gdn_replay_verify(cache, q, k, v, a, b, A_log, slot_ids=slots, dt_bias=dt_bias)
    assert rel_err(o_v, o_fr.double()) < 2e-2


def _gdn_pdl_chain(monkeypatch, kind, env, seed, graph, layers):
    """`layers` GDN layers decoded back to back on one stream, each layer's output the next one's v (each launch reads
    what the launch just ahead of it wrote), for 3L tokens: every layer's outputs and the pools or caches at the end,
    with the environment variables `env` set (REPLAYSSM_PDL=1: programmatic dependent launch, common/cuda_utils.cuh).
    With `graph`, one token's launches are captured once (after a warm-up on copies of the pools) and replayed."""
    gen = torch.Generator().manual_seed(seed)
    HV, H, K, V, batch, num_slots, L = 4, 2, 128, 128, 4, 6, 4
    dev, act = "cuda", torch.bfloat16
    slots = torch.randperm(num_slots, generator=gen)[:batch].to(dev, torch.int32)
    A_log = [(torch.rand(HV, generator=gen) - 1.0).to(dev) for _ in range(layers)]
    dt_bias = [(torch.randn(HV, generator=gen) * 0.5).to(dev) for _ in range(layers)]
    pools = []
    for _ in range(layers):
        init = torch.randn(num_slots, HV, V, K, generator=gen) * 0.1
        if kind == "step":
            pools.append(init.to(dev))
        else:
            cache = GdnReplayCache.allocate(num_slots, HV, H, K, V, ring_len=L, device=dev,
                                            output_view=torch.bfloat16 if kind == "view" else None)
            cache.reset(torch.arange(num_slots, device=dev, dtype=torch.int32), init.to(dev))
            pools.append(cache)
    tokens = 3 * L
    v0 = torch.randn(tokens, batch, HV, V, generator=gen).to(dev, act)
    qs = torch.randn(tokens, layers, batch, H, K, generator=gen).to(dev, act)
    ks = torch.randn(tokens, layers, batch, H, K, generator=gen).to(dev, act)
    gates = torch.randn(tokens, layers, 2, batch, HV, generator=gen).to(dev, act)
    # (NaN: an output left unwritten cannot pass, nor one read early from a reused buffer holding an earlier run's bits)
    outs = torch.full((tokens, layers, batch, HV, V), float("nan"), dtype=act, device=dev)

    def one_token(pools_, q_t, k_t, g_t, v_in, out_t):
        v = v_in
        for i in range(layers):
            args = (q_t[i], k_t[i], v, g_t[i, 0], g_t[i, 1], A_log[i])
            kw = dict(slot_ids=slots, dt_bias=dt_bias[i], out=out_t[i])
            (replayssm.gdn_step if kind == "step" else replayssm.gdn_replay_step)(pools_[i], *args, **kw)
            v = out_t[i]

    state = run_chain(monkeypatch, env, one_token, pools, [qs, ks, gates, v0], outs, graph)
    return outs, state


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kind", ["step", "replay", "view"])
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("layers", [2, 6])
def test_cuda_pdl_launches_give_the_same_bits(monkeypatch, kind, graph, layers):
    """As tests/test_mamba2.py's test of the same name, for gdn_step and gdn_replay_step: with REPLAYSSM_PDL=1 a
    layer's kernel may start while the one ahead (whose output is its v) still runs, reading its own cache before
    and its inputs after waiting for that one; a chain of 2 or 6 layers over 3L tokens (folds included), eager and
    in a CUDA graph, gives the same bits as plain launches, also with the fold-first order kernel forced."""
    seed = torch.randint(0, 2**31 - 1, ()).item()
    pdl = {"REPLAYSSM_PDL": "1"}
    extra = ([dict(pdl, REPLAYSSM_TUNE=t) for t in ("replay_fold_first=1", "pdl_ring_ahead=0", "gdn_replay_prefetch=0")] if kind != "step"
             else [])
    if kind == "replay":  # the small kernel (replay_small.cuh), plain and with PDL
        extra += [{"REPLAYSSM_PDL": "0", "REPLAYSSM_TUNE": "gdn_replay_small=1"}, dict(pdl, REPLAYSSM_TUNE="gdn_replay_small=1")]
    envs = [{"REPLAYSSM_PDL": "0"}, pdl] + extra
    assert_chains_agree(lambda env: _gdn_pdl_chain(monkeypatch, kind, env, seed, graph, layers), envs)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", [
    dict(HV=4, H=2, V=128, L=4),
    dict(HV=6, H=2, V=64, L=32),
    dict(HV=2, H=2, V=32, L=2),
    dict(HV=32, H=16, V=128, L=16),
], ids=lambda c: "HV{HV}H{H}V{V}L{L}".format(**c))
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("align_folds", [True, False], ids=["aligned", "ring-full"])
def test_cuda_small_replay_gives_the_general_bits(monkeypatch, case, graph, align_folds):
    """The small GDN replay-step kernel (csrc/gdn/replay_small.cuh: grids of at most two blocks per SM, e.g. batches 1-2)
    computes every output, checkpoint row, ring entry and cursor with the same fp32 operations in the same order as
    the general kernel's default layout for an fp32 checkpoint and bf16 activations (8 lanes a row): over 2L + 3
    tokens from random cursors and ring contents (folds at every position of the cycle), with a pad row, slots out of
    order and rings up to its limit of 32, both kernels give the same bits, eager and in a CUDA graph (with PDL:
    test_cuda_pdl_launches_give_the_same_bits). (REPLAYSSM_TUNE gdn_replay_small=1 forces the small kernel, 0 forbids
    it.)"""
    seed = torch.randint(0, 2**31 - 1, ()).item()
    gen = torch.Generator().manual_seed(seed)
    HV, H, V, L = (case[k] for k in ("HV", "H", "V", "L"))
    K, batch, num_slots, dev, act = 128, 5, 7, "cuda", torch.bfloat16
    ids = torch.randperm(num_slots, generator=gen)[:batch].to(torch.int32)
    ids[3] = PAD_SLOT
    ids = ids.to(dev)
    layer = GdnLayer(HV, H, K, V, dev, gen)
    cache = GdnReplayCache.allocate(num_slots, HV, H, K, V, ring_len=L, align_folds=align_folds, device=dev)
    if align_folds:  # (a phase part-way through its cycle)
        cache.fold_phase[0] = int(torch.randint(0, L, (), generator=gen))
    cache.checkpoint.copy_(torch.randn(cache.checkpoint.shape, generator=gen) * 0.1)
    cache.ring_u.copy_(torch.randn(cache.ring_u.shape, generator=gen) * 0.1)
    cache.ring_k.copy_(torch.nn.functional.normalize(torch.randn(cache.ring_k.shape, generator=gen), dim=-1))
    cache.ring_g.copy_(-torch.rand(cache.ring_g.shape, generator=gen) * 0.1)
    cache.cursor.copy_(torch.randint(0, L, (num_slots,), generator=gen, dtype=torch.int32))
    tokens = 2 * L + 3
    inputs = token_inputs(layer, batch, act, gen, tokens, ("q", "k", "v", "a", "b"))
    outs = torch.full((tokens, batch, HV, V), float("nan"), dtype=act, device=dev)

    def one_token(pools, q, k, v, a, b, out):
        replayssm.gdn_replay_step(pools[0], q, k, v, a, b, layer.A_log, slot_ids=ids, dt_bias=layer.dt_bias, out=out)

    def chain(env):
        out = outs.clone()
        return out, run_chain(monkeypatch, env, one_token, [clone_cache(cache)], inputs, out, graph)[0]

    want_out, want_state = chain({"REPLAYSSM_PDL": "0", "REPLAYSSM_TUNE": "gdn_replay_small=0"})
    got_out, got_state = chain({"REPLAYSSM_PDL": "0", "REPLAYSSM_TUNE": "gdn_replay_small=1"})
    live = [0, 1, 2, 4]
    assert torch.isnan(want_out[:, 3]).all() and torch.isfinite(want_out[:, live].float()).all()
    assert (want_out[:, live] != 0).float().mean() > 0.9
    assert torch.equal(got_out.nan_to_num(), want_out.nan_to_num()) and torch.isnan(got_out[:, 3]).all()
    for k in want_state:
        assert torch.equal(got_state[k], want_state[k]), k
    assert (got_state["arrivals"] == 0).all()
    rows = ids[live].cpu().long()
    model = FoldModel(cache)
    for _ in range(tokens):
        model.step(rows.tolist())
    assert got_state["cursor"].cpu()[rows].tolist() == [model.cursor[s] for s in rows.tolist()]
    if align_folds:
        assert got_state["fold_phase"].tolist() == [model.phase, 0]
    # (and the pad slot's cache is untouched: only live slots' rows moved)
    pad_free = sorted(set(range(num_slots)) - set(rows.tolist()))
    for k in ("checkpoint", "ring_u", "ring_k", "ring_g", "cursor"):
        assert torch.equal(got_state[k][pad_free], getattr(cache, k)[pad_free]), k
    if not graph:  # (the small kernel ran: the comparison above is not the general kernel against itself)
        assert_kernel_ran(monkeypatch, "gdn_replay_small=1", "gdn_replay_step_small_kernel",
                          lambda: one_token([clone_cache(cache)], *(x[0] for x in inputs), outs[0].clone()))
