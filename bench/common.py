"""Timing as a serving engine runs decode steps: whole cycles captured in CUDA graphs, replayed, timed with
events (median), on data spread over enough independent layers that nothing is served from L2."""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Callable

import torch

L2_BYTES = 60 * 2**20  # H200 (read back from the device where torch exposes it)


def l2_bytes() -> int:
    props = torch.cuda.get_device_properties(0)
    return getattr(props, "L2_cache_size", L2_BYTES) or L2_BYTES


def time_graph(fn: Callable[[], None], replays: int = 20, warmup: int = 3, warmup_s: float = 0.05) -> float:
    """Median µs of one replay of a CUDA graph that captures fn(), after at least `warmup` replays and
    `warmup_s` seconds of them."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up outside the graph (Triton compiles, lazy module loads)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    n, t_end = 0, time.perf_counter() + warmup_s
    while n < warmup or time.perf_counter() < t_end:
        graph.replay()
        torch.cuda.synchronize()
        n += 1
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    del graph
    return statistics.median(times)


def timed_configs(fn: Callable[[], None], tunes) -> dict:
    """µs of fn's graph (time_graph) under each REPLAYSSM_TUNE setting in tunes, the environment restored after;
    then the default timed again ("default again"): the spread between two timings of one version, beside the
    differences between versions (bench/NOTES.md, session 7)."""
    out = {}
    for tune in tunes:
        os.environ["REPLAYSSM_TUNE"] = tune
        try:
            out[tune] = time_graph(fn)
        finally:
            del os.environ["REPLAYSSM_TUNE"]
    out["default again"] = time_graph(fn)
    return out


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


def measure_bandwidth(nbytes: int = 4 * 2**30) -> dict:
    """Device-memory bandwidth in TB/s: a device-to-device copy (bytes read + written) and a read-only
    reduction, both over buffers many times the L2."""
    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    # An elementwise kernel, not copy_: inside a graph copy_ becomes a memcpy node served by the copy
    # engines, which move ~2.8 TB/s on the H200 (seen 2026-11-29), far below what kernels reach.
    copy_us = time_graph(lambda: torch.mul(src, 1.0, out=dst), replays=10)
    acc = torch.empty((), device="cuda")
    read_us = time_graph(lambda: torch.sum(src, dim=0, out=acc), replays=10)
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
    payload = dict(payload, command=" ".join([os.path.basename(sys.executable)] + sys.argv), environment=environment())
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)
    print(f"wrote {path}")
