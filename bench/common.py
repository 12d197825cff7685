"""Timing as a serving engine runs decode steps: whole cycles captured in CUDA graphs, replayed, timed with
events (median), on data spread over enough independent layers that nothing is served from L2. The versions
compared in one table are timed interleaved, in rounds (time_interleaved)."""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from typing import Callable

import torch

# The benchmarks import replayssm from the tree they sit in (a copy of the repository, as the variants step makes,
# need not be installed or on PYTHONPATH: session 16 lost a profile to that).
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

L2_BYTES = 60 * 2**20  # H200 (read back from the device where torch exposes it)


def add_layers_option(parser) -> None:
    """--layers N (decode benchmarks): rotate N >= 2 layers instead of enough to overflow L2 four times."""
    def at_least_two(v: str) -> int:
        n = int(v)
        if n < 2:  # (one layer: consecutive launches on its cache would depend on each other)
            raise argparse.ArgumentTypeError("at least 2")
        return n
    parser.add_argument("--layers", type=at_least_two, default=None,
                        help="rotate this many layers (>= 2) instead of enough to overflow L2 four times: with few, the "
                             "states stay L2-resident (a diagnostic of latency against DRAM; floors and copy fractions "
                             "then do not apply)")


def l2_bytes() -> int:
    props = torch.cuda.get_device_properties(0)
    return getattr(props, "L2_cache_size", L2_BYTES) or L2_BYTES


ROUNDS = 5  # rounds of time_interleaved


def capture(fn: Callable[[], None], tune: str | None = None) -> "torch.cuda.CUDAGraph":
    """A CUDA graph of fn(), captured after one eager run on a side stream (Triton compiles, lazy module loads),
    with REPLAYSSM_TUNE=tune during both when tune is given (the extension reads it at every launch, so the
    graph keeps the configuration), the environment restored after."""
    old = os.environ.get("REPLAYSSM_TUNE")
    if tune is not None:
        os.environ["REPLAYSSM_TUNE"] = tune
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
    finally:
        if tune is not None:
            if old is None:
                del os.environ["REPLAYSSM_TUNE"]
            else:
                os.environ["REPLAYSSM_TUNE"] = old
    return graph


def time_interleaved(fns: dict, rounds: int = ROUNDS, replays: int = 10, warmup_s: float = 0.05):
    """Median µs of one replay of each graph, and each one's spread between rounds.

    fns: {name: fn or (fn, tune)}; every graph is captured first (`capture`), all are replayed round-robin for
    at least warmup_s, then timed in `rounds` rounds, each replaying every graph `replays` times (one replay each,
    event-timed), in a different order each round (a seeded shuffle: with a rotation each graph kept the same
    predecessor in every round, so an effect of the predecessor would bias it instead of showing in the spread;
    session 10's batch-256 anomaly, bench/NOTES.md). The median is over all of a graph's replays; the spread
    is max/min - 1 of its per-round medians. Interleaving puts every version under the same conditions: timed one
    after the other, two timings of one version differed by up to 9% on the H200 (bench/NOTES.md, session 8).
    """
    graphs = {}
    for name, f in fns.items():
        fn, tune = f if isinstance(f, tuple) else (f, None)
        graphs[name] = capture(fn, tune)
    names = list(graphs)
    t_end = time.perf_counter() + warmup_s
    for _ in range(3):  # at least three replays of each, and warmup_s in all
        for name in names:
            graphs[name].replay()
        torch.cuda.synchronize()
    while time.perf_counter() < t_end:
        for name in names:
            graphs[name].replay()
        torch.cuda.synchronize()
    samples = {name: [] for name in names}
    per_round = {name: [] for name in names}
    shuffle = random.Random(0)
    for r in range(rounds):
        order = list(names)
        shuffle.shuffle(order)
        for name in order:
            graph = graphs[name]
            graph.replay()  # untimed: the previous graph's tail and this one's first-touch effects
            times = []
            for _ in range(replays):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                graph.replay()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e3)
            samples[name] += times
            per_round[name].append(statistics.median(times))
    del graphs
    medians = {name: statistics.median(v) for name, v in samples.items()}
    spreads = {name: max(v) / min(v) - 1.0 for name, v in per_round.items()}
    return medians, spreads


def time_graph(fn: Callable[[], None], replays: int = 20) -> float:
    """Median µs of one replay of a CUDA graph of fn() (time_interleaved of fn alone, one round)."""
    return time_interleaved({"fn": fn}, rounds=1, replays=replays)[0]["fn"]


def tune_entries(fn: Callable[[], None], kind: str, tunes) -> dict:
    """time_interleaved entries {(kind, tune): (fn, tune)}: fn under each alternative launch configuration."""
    return {(kind, tune): (fn, tune) for tune in tunes}


def fill_cache(cache, L: int, gen, aligned: bool = False) -> None:
    """A benchmark's fresh replay cache made to look in use: a random checkpoint (x 0.1), its view (if any) equal to
    it, cursors staggered (start_cursors), or all at 0 when aligned."""
    cache.checkpoint.copy_(torch.randn(cache.checkpoint.shape, generator=gen, device=cache.checkpoint.device) * 0.1)
    if cache.view is not None:
        cache.view.copy_(cache.checkpoint)
    start_cursors(cache, L, gen, 0 if aligned else None)


def start_cursors(cache, L: int, gen, at: int | None = None) -> None:
    """A cache's cursors staggered at random, as in a serving batch (every step then folds 1/L of the rows), or all
    at `at` (from 0: the cycle's last step folds every row, the others none)."""
    if at is not None:
        cache.cursor.fill_(at)
    else:
        cache.cursor.copy_(torch.randint(0, L, cache.cursor.shape, generator=gen, device=cache.cursor.device,
                                         dtype=torch.int32))


ALIGNED = "cursors_aligned"


def add_aligned(fns: dict, all_caches: dict, kind: str, caches: list, cycle: Callable[[], None]) -> None:
    """Times `cycle` on caches whose cursors all start at 0, as kind's alternative ALIGNED (same bytes per cycle as
    staggered cursors): what staggered cursors cost, through the folding rows' blocks straggling (common/fold_order.cuh)."""
    add_variant(fns, all_caches, kind, ALIGNED, caches, cycle)


def add_variant(fns: dict, all_caches: dict, kind: str, label: str, caches: list, cycle: Callable[[], None]) -> None:
    """Times `cycle` on its own caches as kind's alternative `label` (e.g. fold_align_entry's)."""
    all_caches[f"{kind}|{label}"] = caches
    fns[(kind, label)] = (cycle, None)


def fold_align_entry(view) -> tuple:
    """The alternative to a cache kind's default fold alignment (replayssm/cache.py, "Aligned folds"): (label,
    align_folds) — plain caches align by default (entry fold_align=0: each row folds when its ring fills), view
    caches do not (fold_align=1)."""
    return ("fold_align=0", False) if view is None else ("fold_align=1", True)


def settle(caches: list, cycle: Callable[[], None]) -> None:
    """Caches with aligned folds start from staggered cursors like the others; one cycle, run once before timing,
    passes a phase boundary, where every row folds (early, once) and from where all fold at the same step: what a
    serving batch whose sequences joined at different tokens converges to. Timed cycles start there."""
    if any(c.fold_phase is not None for c in caches):
        cycle()


def cursors_of(all_caches: dict) -> dict:
    """{name: the stacked cursors of its caches}, to check after timing that every replay went full cycles."""
    return {name: torch.stack([c.cursor.clone() for c in caches]) for name, caches in all_caches.items()}


def decode_times(r: dict, times: dict, per: float, tune: bool, baseline: str, all_caches: dict, before: dict) -> None:
    """Fills r with µs per step and layer of the standard step, the baseline (mamba_ssm or fla), the replay step and
    the view (and with tune their alternative configurations) from time_interleaved's medians of graphs of `per`
    steps; asserts that every replay left the cursors where they started (a cycle is L steps: all the way round)."""
    after = cursors_of(all_caches)
    for name in before:
        assert torch.equal(before[name], after[name]), f"{name}: cursors did not advance full cycles"
    for name in ("standard", baseline, "replay", "replay_view"):
        if name in times:
            r[f"{name}_us"] = times[name] / per
        if tune and name != baseline:
            r[f"{name}_tuning_us"] = tunings(times, name, per)


def tunings(times: dict, kind: str, per: float) -> dict:
    """{tune: µs per step} of kind's alternative configurations in time_interleaved's medians."""
    return {k[1]: v / per for k, v in times.items() if isinstance(k, tuple) and k[0] == kind}


def decode_ratios(r: dict, nbytes: dict, bw: dict) -> None:
    """Adds to a decode-step result r (standard_us, replay_us, replay_view_us) the floors (bytes over the copy
    bandwidth for the standard step, over the larger of read and copy for replay) and the ratios reported."""
    r["bytes"] = nbytes
    r["standard_floor_us"] = nbytes["standard"] / (bw["copy_TBps"] * 1e6)
    r["standard_frac_copy_bw"] = r["standard_floor_us"] / r["standard_us"]
    for kind in ("replay", "replay_view"):
        r[f"{kind}_floor_us"] = nbytes[kind] / (max(bw["read_TBps"], bw["copy_TBps"]) * 1e6)
        r[f"{kind}_vs_standard"] = r["standard_us"] / r[f"{kind}_us"]
        r[f"{kind}_over_floor"] = r[f"{kind}_us"] / r[f"{kind}_floor_us"]


def print_view_and_tunings(rows: list) -> None:
    """The replay-with-view table and the alternative launch configurations of a decode-step benchmark."""
    print("with the bf16 output view (numerical split):")
    print(f"{'batch':>5} {'view':>8} {'floor':>7} {'view/floor':>10} {'speedup':>8}")
    for r in rows:
        print(f"{r['batch']:>5} {r['replay_view_us']:>8.1f} {r['replay_view_floor_us']:>7.1f} "
              f"{r['replay_view_over_floor']:>10.2f} {r['replay_view_vs_standard']:>7.2f}x")
    for r in rows:
        for kind in ("standard", "replay", "replay_view"):
            for tune, us in r.get(f"{kind}_tuning_us", {}).items():
                print(f"  batch {r['batch']:>3} {kind:>8} {tune:<28} {us:8.1f} us (default {r[f'{kind}_us']:.1f})")
    for r in rows:
        print_spread(r)


def spread_names(spreads: dict) -> dict:
    """time_interleaved's spreads with JSON keys ("kind|tune" for an alternative configuration)."""
    return {"|".join(k) if isinstance(k, tuple) else k: v for k, v in spreads.items()}


def print_spread(r: dict) -> None:
    if r.get("round_spread"):
        worst = max(r["round_spread"], key=r["round_spread"].get)
        print(f"  batch {r['batch']:>3} spread between rounds: at most {100 * r['round_spread'][worst]:.1f}% ({worst}), "
              f"median {100 * statistics.median(r['round_spread'].values()):.1f}%")


def measure_bandwidth(nbytes: int = 4 * 2**30) -> dict:
    """Device-memory bandwidth in TB/s: a device-to-device copy (bytes read + written) and a read-only
    reduction, both over buffers many times the L2."""
    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    # An elementwise kernel, not copy_: inside a graph copy_ becomes a memcpy node served by the copy
    # engines, which move ~2.8 TB/s on the H200 (seen 2026-11-29), far below what kernels reach.
    acc = torch.empty((), device="cuda")
    # Interleaved in rounds as the kernels are: timed once each, the read bandwidth moved 4.38-4.46 TB/s from run
    # to run in session 8, and the replay's floor ratio with it (1.10x-1.13x at batch 256).
    times, _ = time_interleaved({"copy": lambda: torch.mul(src, 1.0, out=dst), "read": lambda: torch.sum(src, dim=0, out=acc)},
                                replays=6)
    copy_us, read_us = times["copy"], times["read"]
    del src, dst
    torch.cuda.empty_cache()
    return {"copy_TBps": 2 * nbytes / copy_us / 1e6, "read_TBps": nbytes / read_us / 1e6}


def environment() -> dict:
    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "device": torch.cuda.get_device_name(0), "sms": torch.cuda.get_device_properties(0).multi_processor_count}
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        pass
    # The commit measured: REPLAYSSM_COMMIT when set (scripts/gpu_job.sh sets it from a .commit file carried
    # with the tree: the GPU machine's copy of .git may be stale, seen 2026-11-29), else that .commit file, else
    # git's HEAD.
    env["commit"] = os.environ.get("REPLAYSSM_COMMIT", "")
    commit_file = os.path.join(os.path.dirname(__file__), "..", ".commit")
    if not env["commit"] and os.path.exists(commit_file):  # (run without gpu_job.sh: seen 2026-12-01)
        with open(commit_file) as f:
            env["commit"] = f.read().strip()
    if not env["commit"]:
        try:
            env["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                           cwd=os.path.dirname(__file__)).stdout.strip()
        except OSError:
            pass
    return env


def write_result(path: str, payload: dict) -> None:
    # (the switches that change what the extension launches are part of the command: REPLAYSSM_PDL=1 python3 ...)
    switches = [f"{k}={os.environ[k]}" for k in ("REPLAYSSM_PDL", "REPLAYSSM_TUNE") if os.environ.get(k)]
    payload = dict(payload, command=" ".join(switches + [os.path.basename(sys.executable)] + sys.argv),
                   environment=environment())
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)
    print(f"wrote {path}")
