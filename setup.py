"""Builds replayssm._C: CPU sources always, CUDA sources whenever nvcc is found (sm_90a unless
TORCH_CUDA_ARCH_LIST says otherwise). `pip install -e . --no-build-isolation` (torch must be installed)."""
import glob
import os
import shutil


def find_cuda_home():
    """CUDA_HOME (or CUDA_PATH) when set; else the toolkit whose include/ has the runtime headers, looked for
    beside the nvcc on PATH and at /usr/local/cuda(-*). torch's own guess takes nvcc's grandparent folder,
    which is wrong when nvcc on PATH is a wrapper script (e.g. /usr/local/bin/nvcc)."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            return os.environ[var]
    candidates = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    candidates += ["/usr/local/cuda"] + sorted(glob.glob("/usr/local/cuda-*"), reverse=True)
    for home in candidates:
        if os.path.exists(os.path.join(home, "include", "cuda_runtime_api.h")) and os.path.exists(os.path.join(home, "bin", "nvcc")):
            return home
    return None


if find_cuda_home() and not os.environ.get("CUDA_HOME"):
    os.environ["CUDA_HOME"] = find_cuda_home()  # before torch.utils.cpp_extension reads it

from setuptools import find_packages, setup  # noqa: E402
from torch.utils import cpp_extension  # noqa: E402
with_cuda = cpp_extension.CUDA_HOME is not None and os.environ.get("REPLAYSSM_NO_CUDA", "0") != "1"

sources = ["csrc/registration.cpp"] + sorted(glob.glob("csrc/*/*.cpp"))
CXX_STD = os.environ.get("REPLAYSSM_CXX_STD", "20")  # torch >= 2.13 headers need C++20
cxx_flags = ["-O3", f"-std=c++{CXX_STD}"]
define_macros = []
if with_cuda:
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0a")
    sources += sorted(glob.glob("csrc/*/*.cu"))
    define_macros.append(("RSSM_WITH_CUDA", None))
    ext = cpp_extension.CUDAExtension(
        "replayssm._C",
        sources,
        define_macros=define_macros,
        extra_compile_args={
            "cxx": cxx_flags,
            "nvcc": ["-O3", f"-std=c++{CXX_STD}", "-lineinfo", "--expt-relaxed-constexpr", "-Xptxas=-warn-spills"],
        },
    )
else:
    ext = cpp_extension.CppExtension("replayssm._C", sources, extra_compile_args={"cxx": cxx_flags})

setup(
    name="replayssm",
    version="0.1.0",
    description="ReplaySSM decoding kernels for state-space layers (Mamba-2, Gated DeltaNet)",
    packages=find_packages(include=["replayssm", "replayssm.*"]),
    ext_modules=[ext],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
    python_requires=">=3.10",
)
