"""A viewer process raises the cyclic collector's thresholds (store/gc_pause.py
``raise_viewer_thresholds``, from ``zeroscope run``, ``attach`` and ``replay``) and touches
nothing else of the collector; a process running the agent or the engine keeps Python's
defaults (the training job's collector is the user's). Each answer is ``gc.get_threshold()``
read in a fresh interpreter, before and after, against the defaults that same Python reports."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

from tests.fixtures import synthetic_run, write_trace

ROOT = Path(__file__).resolve().parent.parent
RAISED = (50_000, 20, 100)


def _fresh(code: str, *args: str) -> dict[str, list[int]]:
    """Run ``code`` in a fresh interpreter; it prints one JSON line last, prefixed ``GC ``."""
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    line = [x for x in done.stdout.splitlines() if x.startswith("GC ")][-1]
    return dict(json.loads(line[3:]))


def _defaults() -> list[int]:
    return _fresh('import gc, json; print("GC " + json.dumps({"t": gc.get_threshold()}))')["t"]


def _expected_raised() -> list[int]:
    if sys.version_info >= (3, 14):  # the incremental collector ignores the third value
        return list(RAISED[:2])
    return list(RAISED)


def test_replay_headless_raises_the_thresholds_and_nothing_else(tmp_path: Path) -> None:
    trace = tmp_path / "run.zstrace"
    write_trace(trace, synthetic_run())
    code = (
        "import gc, json, sys\n"
        "from zeroscope.cli import main\n"
        "before = gc.get_threshold()\n"
        "rc = main(['replay', '--headless', sys.argv[1]])\n"
        "print('GC ' + json.dumps({'before': before, 'after': gc.get_threshold(), 'rc': [rc],\n"
        "    'enabled': [gc.isenabled()]}))\n"
    )
    got = _fresh(code, str(trace))
    assert got["rc"] == [0]
    assert got["before"] == _defaults()
    assert got["after"][: len(_expected_raised())] == _expected_raised()
    assert got["enabled"] == [True]


def test_attach_raises_the_thresholds_before_it_reaches_its_target() -> None:
    code = (
        "import gc, json\n"
        "from zeroscope.cli import main\n"
        "before = gc.get_threshold()\n"
        "rc = main(['attach', ''])\n"  # not an SSH target: refused after the viewer's start-up
        "print('GC ' + json.dumps({'before': before, 'after': gc.get_threshold(), 'rc': [rc]}))\n"
    )
    got = _fresh(code)
    assert got["rc"] == [2]
    assert got["before"] == _defaults()
    assert got["after"][: len(_expected_raised())] == _expected_raised()


def test_the_function_sets_only_the_thresholds() -> None:
    from zeroscope.store.gc_pause import VIEWER_THRESHOLDS, raise_viewer_thresholds

    assert VIEWER_THRESHOLDS == RAISED
    before, enabled, frozen = gc.get_threshold(), gc.isenabled(), gc.get_freeze_count()
    try:
        raise_viewer_thresholds()
        assert list(gc.get_threshold()[:2]) == list(RAISED[:2])
        assert gc.isenabled() is enabled
        assert gc.get_freeze_count() == frozen
    finally:
        gc.set_threshold(*before)


def test_a_process_running_the_agent_keeps_pythons_defaults() -> None:
    code = (
        "import gc, json\n"
        "import zeroscope.agent, zeroscope.engine\n"
        "from zeroscope.agent import api\n"
        "api.telemetry()\n"
        "print('GC ' + json.dumps({'t': gc.get_threshold()}))\n"
    )
    assert _fresh(code)["t"] == _defaults()


def test_agent_and_engine_never_set_the_thresholds() -> None:
    for folder in ("agent", "engine"):
        for path in (ROOT / folder).rglob("*.py"):
            assert "set_threshold" not in path.read_text(), path
