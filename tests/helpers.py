"""Random inputs as trained Mamba-2 layers see them, error measures with dtype-keyed tolerances, and a decoding
loop run eagerly or in a CUDA graph."""
import dataclasses
import importlib.util
import math
import os

import pytest
import torch

from replayssm import reference as R

# Unit roundoff of each storage dtype (half the gap between 1 and the next value).
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def tolerance(act_dtype, state_dtype):
    """Bound on ||out - ref|| / ||ref|| against the float64 reference that rounds the state where the op
    stores it. Outputs are rounded once to act_dtype (relative error <= u_act); a stored state can round the
    other way from the reference on a near-tie (a few u_state); fp32 arithmetic over tens of tokens stays
    far under 2e-5."""
    return 2 * UNIT_ROUNDOFF[act_dtype] + 4 * UNIT_ROUNDOFF[state_dtype] + 2e-5


def rel_err(a, ref):
    a, ref = a.double().cpu(), ref.double().cpu()
    return ((a - ref).norm() / ref.norm().clamp_min(1e-30)).item()


class Layer:
    """Per-head parameters drawn as trained models have them: decays mostly near 1, a few fast heads."""

    def __init__(self, nheads, headdim, ngroups, dstate, device, gen, dt_softplus=True, with_D=True, with_z=True):
        self.shape = (nheads, headdim, ngroups, dstate)
        A_log = torch.empty(nheads).uniform_(math.log(1.0), math.log(16.0), generator=gen)
        self.A = (-torch.exp(A_log)).to(device)
        dt0 = torch.exp(torch.empty(nheads).uniform_(math.log(1e-3), math.log(1e-1), generator=gen))
        self.dt_bias = (dt0 + torch.log(-torch.expm1(-dt0))).to(device)  # softplus^-1(dt0)
        self.D = torch.randn(nheads, generator=gen).to(device) if with_D else None
        self.dt_softplus = dt_softplus
        self.with_z = with_z
        self.device = device

    def kwargs(self):
        return dict(D=self.D, dt_bias=self.dt_bias, dt_softplus=self.dt_softplus)

    def token(self, batch, act_dtype, gen):
        H, P, G, N = self.shape
        def rnd(*shape, scale=1.0):
            return (torch.randn(*shape, generator=gen) * scale).to(self.device, act_dtype)
        return dict(x=rnd(batch, H, P), dt=rnd(batch, H, scale=0.5), B=rnd(batch, G, N), C=rnd(batch, G, N),
                    z=rnd(batch, H, P) if self.with_z else None)

    def reference_step(self, state64, tok):
        """The float64 reference step on the CPU (tok's tensors on the CPU)."""
        cpu = lambda t: None if t is None else t.cpu()
        dt = R.process_dt(tok["dt"], cpu(self.dt_bias), self.dt_softplus)
        return R.mamba2_step(state64, tok["x"], dt, cpu(self.A), tok["B"], tok["C"], cpu(self.D), tok["z"])


class FoldModel:
    """The fold steps and cursors a replay cache's replay step gives (replayssm/cache.py, "Aligned folds"): a row folds
    when its ring fills, or, with the cache's fold phase, when the phase is at ring_len - 1; the phase advances once
    per call."""

    def __init__(self, cache, num_slots=None):
        self.L = cache.ring_len
        self.cursor = cache.cursor.cpu().tolist() if num_slots is None else [0] * num_slots
        self.phase = None if cache.fold_phase is None else int(cache.fold_phase[0])

    def step(self, slots):
        """Advances the slots stepped in one call (an iterable of slot ids); returns {slot: folds}."""
        phase_folds = self.phase is not None and self.phase + 1 == self.L
        folds = {}
        for s in slots:
            folds[s] = self.cursor[s] + 1 == self.L or phase_folds
            self.cursor[s] = 0 if folds[s] else self.cursor[s] + 1
        if self.phase is not None:
            self.phase = (self.phase + 1) % self.L
        return folds


def clone_cache(cache):
    """A copy of a replay cache (any of the package's cache dataclasses) with every tensor cloned."""
    return dataclasses.replace(cache, **{k: v.clone() for k, v in vars(cache).items() if isinstance(v, torch.Tensor)})


def token_inputs(layer, batch, act_dtype, gen, tokens, keys):
    """`tokens` tokens of layer.token's random inputs, each input in `keys` stacked over a leading token axis (run_chain's
    inputs)."""
    toks = [layer.token(batch, act_dtype, gen) for _ in range(tokens)]
    return [torch.stack([tk[k] for tk in toks]) for k in keys]


def capture_graph(warm_up, body):
    """A CUDA graph of body()'s launches, after warm_up() (the same launches on throwaway copies: lazy initialisation)
    on a side stream."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        warm_up()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    return graph


def load_script(*path):
    """A Python file of the repository (e.g. "bench", "targets.py") loaded as a module, for the tests of scripts."""
    full = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), *path)
    spec = importlib.util.spec_from_file_location(os.path.splitext(path[-1])[0], full)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_chain(monkeypatch, env, one_token, pools, inputs, outs, graph):
    """Decodes outs.shape[0] tokens with one_token(pools, *inputs_t, out_t) (inputs: tensors with a leading token axis;
    pools: state tensors or caches, which it updates), with the environment variables `env` set. With `graph`, one
    token's launches are captured once in a CUDA graph (after a warm-up on copies of the pools, on a side stream) and
    replayed, each token's inputs copied into the captured ones. Returns the pools' tensors at the end (a cache as a
    dict of its tensors)."""
    tensors = lambda p: {k: v for k, v in vars(p).items() if isinstance(v, torch.Tensor)}
    clone = lambda p: p.clone() if isinstance(p, torch.Tensor) else clone_cache(p)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    torch.cuda.synchronize()
    if not graph:
        for t in range(outs.shape[0]):
            one_token(pools, *(x[t] for x in inputs), outs[t])
    else:
        static, out = [x[0].clone() for x in inputs], outs[0].clone()  # (rows never written, e.g. pads, keep outs' fill)
        g = capture_graph(lambda: one_token([clone(p) for p in pools], *static, out), lambda: one_token(pools, *static, out))
        for t in range(outs.shape[0]):
            for dst, x in zip(static, inputs):
                dst.copy_(x[t])
            g.replay()
            outs[t].copy_(out)
    torch.cuda.synchronize()
    for name in env:
        monkeypatch.delenv(name)
    return [p if isinstance(p, torch.Tensor) else tensors(p) for p in pools]


def assert_chains_agree(chain, envs):
    """chain(env) -> (outputs, the pools' tensors as run_chain returns them) of one decoding run with the environment
    variables env: the run of envs[0] (finite outputs that do not collapse to 0) against that of each other env, bit
    for bit, outputs and pools. Returns envs[0]'s run (the others' are the same bits)."""
    want_out, want_state = chain(envs[0])
    assert torch.isfinite(want_out.float()).all() and (want_out[:, -1] != 0).float().mean() > 0.9  # (no collapse to 0)
    for env in envs[1:]:
        got_out, got_state = chain(env)
        assert torch.equal(got_out, want_out), env
        for a, b in zip(got_state, want_state):
            if isinstance(a, torch.Tensor):
                assert torch.equal(a, b), env
            else:
                assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), env
    return want_out, want_state


def assert_only_batch_slots_moved(got, pool, ids):
    """A state pool after a chain of standard steps on the slots `ids`, against the pool before: those slots' states
    moved, every other slot is bit for bit as it was."""
    assert not torch.equal(got, pool)  # (the states moved)
    others = sorted(set(range(pool.shape[0])) - set(ids.cpu().tolist()))
    assert torch.equal(got[others], pool[others])  # slots outside the batch untouched


def assert_kernel_ran(monkeypatch, tune, kernel, launch):
    """launch() under REPLAYSSM_TUNE=tune, recorded by the CUDA profiler, ran a kernel whose name contains `kernel`
    (so that a comparison of two launch configurations is not one kernel against itself). Skips where the profiler
    records no kernel at all (CUPTI unavailable: under compute-sanitizer it has another subscriber)."""
    monkeypatch.setenv("REPLAYSSM_TUNE", tune)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        launch()
        torch.cuda.synchronize()
    monkeypatch.delenv("REPLAYSSM_TUNE")
    events = prof.key_averages()
    ran = any(kernel in e.key for e in events)
    if not ran and not any(e.device_type == torch.autograd.DeviceType.CUDA for e in events):
        pytest.skip("the CUDA profiler recorded no kernel, so which kernel ran cannot be checked here")
    assert ran, [e.key for e in events]


def assert_verify_graph_matches_eager(step, eager, new_tokens, out_key, fields, T, L, gen, rounds=12):
    """verify + commit, step(cache, tokens, out) over rows [slot 3, pad, slot 0] of `eager`, captured once in a CUDA
    graph on a copy of the cache and replayed `rounds` times with new tokens (new_tokens() -> dict of (3, T, ...)), token
    counts and accepted counts written into the captured tensors, gives what eager launches give, bit for bit (the
    outputs, shaped as tokens[out_key], and the cache's `fields`), across early folds; the pad row's outputs stay
    untouched. step reads the counts from its own `n_tok` and `accepted` arguments: step(cache, tokens, out, n_tok,
    accepted)."""
    graphed = clone_cache(eager)
    static = new_tokens()
    first = next(iter(static.values()))
    n_tok = torch.full((3,), T, dtype=torch.int32, device=first.device)
    accepted = torch.ones(3, dtype=torch.int32, device=first.device)
    out_graph = torch.full_like(static[out_key], float("nan"))
    graph = capture_graph(lambda: step(clone_cache(eager), static, torch.empty_like(out_graph), n_tok, accepted),
                          lambda: step(graphed, static, out_graph, n_tok, accepted))
    folds = 0
    for _ in range(rounds):
        tok = new_tokens()
        for k, v in tok.items():
            static[k].copy_(v)
        n_tok.copy_(torch.randint(1, T + 1, (3,), generator=gen, dtype=torch.int32))
        accepted.copy_(torch.minimum(torch.randint(1, T + 1, (3,), generator=gen, dtype=torch.int32), n_tok.cpu()))
        folds += int((eager.cursor[[3, 0]].cpu() + n_tok.cpu()[[0, 2]] > L).sum())
        out_eager = torch.full_like(out_graph, float("nan"))
        out_graph.fill_(float("nan"))
        step(eager, tok, out_eager, n_tok, accepted)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out_graph.nan_to_num(7.0), out_eager.nan_to_num(7.0))
        for name in fields:
            assert torch.equal(getattr(graphed, name), getattr(eager, name)), name
        assert torch.isnan(out_graph[1]).all()
    assert folds > 0
