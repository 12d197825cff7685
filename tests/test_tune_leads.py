"""bench/tune_leads.py reports the tune entries that beat their default beyond the threshold and the noise, and no
others (CPU; the benchmarks' JSON layout)."""
import random

from helpers import load_script


def test_leads_are_the_entries_faster_than_default_beyond_threshold_and_spread():
    mod = load_script("bench", "tune_leads.py")
    rng = random.Random()
    base = rng.uniform(5.0, 500.0)
    doc = {"rows": [{
        "batch": rng.choice([1, 8, 32, 256]),
        "replay_us": base,
        "replay_tuning_us": {
            "fast": base * 0.90,          # 10% faster, quiet: a lead
            "noisy": base * 0.95,         # 5% faster, but its rounds spread 3%: 2x spread = 6% > 5%: not a lead
            "small": base * 0.99,         # 1% faster: under the 3% threshold
            "slow": base * 1.10,          # slower
            "pdl=1": base * 0.70,         # opt-in launch mode: left out unless include_all
            "cursors_aligned": base * 0.8,
        },
        "round_spread": {"replay": 0.002, "replay|noisy": 0.03},
        "standard_us": base,
        "standard_tuning_us": {},
    }]}
    found = {(kind, entry) for _, kind, entry, *_ in mod.leads(doc)}
    assert found == {("replay", "fast")}
    found_all = {entry for _, _, entry, *_ in mod.leads(doc, include_all=True)}
    assert found_all == {"fast", "pdl=1", "cursors_aligned"}
    (label, kind, entry, default_us, us, gain), = mod.leads(doc)
    assert abs(gain - 10.0) < 1e-6 and us < default_us and label.startswith("batch ")
