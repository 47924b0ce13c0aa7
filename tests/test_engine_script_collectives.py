"""A bundled-engine job's own collectives, beside the engine's (agent/script_collectives.py).

The engine records what it issues; the script's own collectives on the same group (a loss
all-reduced for a log line, a barrier, a broadcast) were seen by nothing: the attach stands down
when the engine reports for itself. The oracles: the job's own account of what it issued after
each step's end (tests/jobs/engine_script_collectives.py), and the same job with ``--quiet``
(the engine's collectives alone), whose every step must read as the loud job's steps less the
script's. Losses bitwise those of bare torchrun.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.attach_support import JOBS, job_env, plain_and_watched, read_trace, run_zeroscope

SCRIPT = JOBS / "engine_script_collectives.py"
STEPS = 7


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_scripts_own_collectives_are_read_beside_the_engines_and_nothing_twice(
    tmp_path: Path,
) -> None:
    loud, plain, watched = plain_and_watched(SCRIPT, STEPS, tmp_path)
    args = ["--steps", str(STEPS), "--quiet", "--out", str(tmp_path / "q")]
    run_zeroscope(SCRIPT, args, job_env(), tmp_path / "q.zstrace", 300)
    quiet = read_trace(tmp_path / "q.zstrace")
    for rank in range(2):
        job, alone = watched[rank], plain[rank]
        assert job["losses"] == alone["losses"]  # bitwise: zeroscope changed nothing it computes
        steps, engine_only = loud[rank].steps, quiet[rank].steps
        assert [s.step for s in steps] == [s.step for s in engine_only] == list(range(1, STEPS + 1))
        for report, reference in zip(steps, engine_only, strict=True):
            script = [c for c in report.collectives if c.label == "script"]
            # Exactly what the script issued since the last step end, in its order (step 1:
            # the barrier before initialize), each once.
            assert [[c.op, c.nbytes] for c in script] == job["issued"][str(report.step)]
            # On gloo torch's record has no completion time: bytes and counts, no duration.
            assert all(c.clock == "none" and not c.exposed_measured for c in script)
            # The engine's own, as the job without the script's collectives reports them.
            own = [(c.op, c.nbytes, c.label) for c in report.collectives if c.label != "script"]
            assert own == [(c.op, c.nbytes, c.label) for c in reference.collectives]
        assert not any(c.label == "script" for s in engine_only for c in s.collectives)
