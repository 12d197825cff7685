import pytest
import torch

HAS_CUDA = torch.cuda.is_available()

# CPU always; CUDA marked `cuda` and skipped (reported as skipped, never as passed) without a GPU.
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")])]


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


# A skipped test that is neither a CUDA test nor marked `optional` (it needs a tool the machine may lack) fails the
# run: CPU tests always run, so a CPU test skipped by mistake is never reported as a green run.
_unexpected_skips = []


def pytest_runtest_logreport(report):
    if report.skipped and "cuda" not in report.keywords and "optional" not in report.keywords:
        _unexpected_skips.append(report.nodeid)


def pytest_terminal_summary(terminalreporter):
    if _unexpected_skips:
        terminalreporter.write_line(f"{len(_unexpected_skips)} CPU test(s) skipped, which fails the run (conftest.py):",
                                    red=True)
        for nodeid in _unexpected_skips:
            terminalreporter.write_line(f"  {nodeid}", red=True)


def pytest_sessionfinish(session, exitstatus):
    if _unexpected_skips and exitstatus == 0:
        session.exitstatus = 1
