import pytest
import torch

HAS_CUDA = torch.cuda.is_available()

# CPU always; CUDA marked `cuda` and skipped (reported as skipped, never as passed) without a GPU.
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")])]


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param
