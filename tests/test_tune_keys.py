"""REPLAYSSM_TUNE keys (csrc/common/cuda_utils.cuh, tune_knob): the launchers ignore a key they do not read, so a
misspelt key in a test would compare the default launch with itself and in a benchmark would time the default under
another name. Every key that the tests and the benchmarks' tune entries set is one that csrc reads."""
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The benchmarks whose --tune entries are REPLAYSSM_TUNE strings (bench/verify_timeline.py sets the keys that
# bench/patches/*-timeline.patch adds, and bench/anomaly_probe.py an unread key on purpose: not checked).
BENCHES = ["bench_mamba2.py", "bench_gdn.py", "bench_speculative.py", "bench_gdn_speculative.py"]


def keys_read_by_csrc():
    keys = set()
    for path in glob.glob(os.path.join(ROOT, "csrc", "**", "*.*"), recursive=True):
        src = open(path).read()
        keys |= set(re.findall(r'tune_knob\("([a-z0-9_]+)"\)', src))
        for listed in re.findall(r'for \(const char\* key : \{([^}]*)\}\)', src):  # (keys read in a loop)
            keys |= set(re.findall(r'"([a-z0-9_]+)"', listed))
    return keys


def keys_set_in(paths):
    """Keys of "key=value[,key=value...]" string literals, with the file that sets each."""
    found = {}
    for path in paths:
        for literal in re.findall(r'"([^"\n]*)"', open(path).read()):
            for key in re.findall(r'(?:^|,)([a-z][a-z0-9_]*)=-?\d+(?=,|$)', literal):
                found.setdefault(key, set()).add(os.path.relpath(path, ROOT))
    return found


def test_every_tune_key_set_is_read_by_a_launcher():
    read = keys_read_by_csrc()
    assert len(read) > 20  # (the scan found the launchers' knobs)
    paths = glob.glob(os.path.join(ROOT, "tests", "*.py")) + [os.path.join(ROOT, "bench", b) for b in BENCHES]
    used = keys_set_in(paths)
    assert {"replay_small", "verify_rows", "stream_lean"} <= set(used)  # (the scan found the tests' strings)
    unknown = {key: sorted(files) for key, files in used.items() if key not in read}
    assert not unknown, f"REPLAYSSM_TUNE keys no launcher reads: {unknown}"


def test_the_scan_finds_a_misspelt_key(tmp_path):
    misspelt = "stream_" + "laen"  # (not a literal: this file is one of those scanned)
    bad = tmp_path / "t.py"
    bad.write_text(f'monkeypatch.setenv("REPLAYSSM_TUNE", "verify_rows=32,{misspelt}=0")\n')
    assert set(keys_set_in([str(bad)])) - keys_read_by_csrc() == {misspelt}
