"""Tier 1: bench/gpu_semantics.py's verdicts (the GPU slot's collective-timing rows) from
figures given here: PASS for figures that hold the semantics, FAIL for the ones the code
before them produced, NA on the CPU with the reason."""

from __future__ import annotations

from bench.gpu_semantics import verdicts

SLEEP = 0.1
GOOD = {
    "sleep_s": SLEEP,
    "overlapped": {
        "duration_s": 0.002,
        "exposed_s": 0.0,
        "clock": "device",
        "exposed_measured": True,
    },
    "at once": {
        "duration_s": 0.002,
        "exposed_s": 0.0019,
        "clock": "device",
        "exposed_measured": True,
    },
    "reuse": {"agent": True, "bare": True},
}


def test_figures_that_hold_the_semantics_pass_and_the_cpu_says_na() -> None:
    assert [v["verdict"] for v in verdicts(GOOD, cuda=True)] == ["PASS"] * 4
    na = verdicts({}, cuda=False)
    assert [v["verdict"] for v in na] == ["NA"] * 4 and all(v["seen"] for v in na)


def test_the_old_codes_figures_fail() -> None:
    """Before: the duration ran to a pool stream's callback event (queued behind the sleep),
    an attached GPU op was clock ``none``, and the callback parked freed buffers."""
    old = {
        "sleep_s": SLEEP,
        "overlapped": {**GOOD["overlapped"], "duration_s": 0.09},
        "at once": {**GOOD["at once"], "clock": "none", "exposed_measured": False},
        "reuse": {"agent": False, "bare": True},
    }
    got = [v["verdict"] for v in verdicts(old, cuda=True)]
    assert got == ["FAIL", "FAIL", "FAIL", "FAIL"]
    missing = [v["verdict"] for v in verdicts({"sleep_s": SLEEP}, cuda=True)]
    assert missing == ["FAIL", "FAIL", "FAIL", "FAIL"]  # no report is no pass
