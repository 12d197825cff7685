"""The CMake build produces a library that torch.ops.load_library loads and whose ops run (CPU-only build,
so that it runs everywhere; the CUDA sources go through the same CMake lists when nvcc is found)."""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.optional
@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not installed")
def test_cmake_build_loads_with_torch_ops_load_library(tmp_path):
    build = tmp_path / "build"
    configure = ["cmake", "-S", ROOT, "-B", str(build), "-DREPLAYSSM_CUDA=OFF",
                 f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}", f"-DPython3_EXECUTABLE={sys.executable}"]
    for cmd in (configure, ["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2)]):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lib = build / "libreplayssm.so"
    assert lib.exists()
    # A fresh process: the package's own library would register the same ops a second time.
    code = textwrap.dedent(f"""
        import torch
        torch.ops.load_library({str(lib)!r})
        state = torch.zeros(3, 2, 4, 16)
        x = torch.randn(1, 2, 4)
        B = torch.randn(1, 1, 16)
        out = torch.empty_like(x)
        torch.ops.replayssm.mamba2_step(state, x, torch.randn(1, 2), -torch.ones(2), B, B, None, None, None, True,
                                        0.0, float("inf"), torch.tensor([1], dtype=torch.int32), out)
        assert state[1].abs().sum() > 0 and state[0].abs().sum() == 0 and state[2].abs().sum() == 0
        print("loaded and ran")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0 and "loaded and ran" in proc.stdout, proc.stderr[-3000:]
