"""An HF Trainer evaluating every few steps (``eval_strategy="steps"``) on DDP, unmodified,
under ``zeroscope run``: the evaluation is its own phase of the step after it, and no step
loses DDP's bucket all-reduce under the evaluation's burst of collectives.

Oracles: the job's own clock around each evaluation (Trainer callbacks, tests/jobs/
hf_eval_train.py) and DDP's own logged bucket sizes. Before: the evaluation (DDP's model
evaluated unwrapped, out of DDP's forward) read as the next step's data loading, and its ~200
gathers turned torch's Flight Recorder ring over under the reducer's entries of the steps
before it, which no read had taken yet: those steps showed no all-reduce at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.attach_support import job_env, read_outputs, read_trace, run_zeroscope

SCRIPT = Path(__file__).resolve().parent / "jobs" / "hf_eval_train.py"
STEPS, EVERY = 7, 3


@pytest.mark.slow
def test_an_evaluation_is_its_own_phase_and_no_step_loses_its_all_reduce(tmp_path: Path) -> None:
    args = ["--steps", str(STEPS), "--eval-steps", str(EVERY), "--out", str(tmp_path / "o")]
    done = run_zeroscope(
        SCRIPT, [*args, "--workdir", str(tmp_path / "w")], job_env(), tmp_path / "t.zstrace", 300
    )
    # Nothing overwritten before a read (the console would say so).
    assert "Flight Recorder ring" not in done.stderr, done.stderr[-3000:]
    # The step line says the evaluation in its time, the steps after an evaluation only.
    said = [int(ln.split()[1]) for ln in done.stdout.splitlines() if "  (eval " in ln]
    assert said == [EVERY + 1, 2 * EVERY + 1]
    outs = read_outputs(tmp_path / "o")
    trace = read_trace(tmp_path / "t.zstrace")
    for rank in (0, 1):
        steps = trace[rank].steps
        evals = {e["step"]: e for e in outs[rank]["evals"]}
        assert [s.step for s in steps] == list(range(1, STEPS + 1))
        assert sorted(evals) == [EVERY, 2 * EVERY]
        for report in steps:
            # DDP's bucket all-reduce in every step, by its own logged size (on gloo the
            # recorder carries no duration: untimed, never guessed).
            reduced = sorted(c.nbytes for c in report.collectives if c.op == "all_reduce")
            for size in outs[rank]["bucket_bytes"]:
                assert size in reduced, (report.step, reduced)
            after = evals.get(report.step - 1)
            if after is None:
                assert report.phases.eval is None
                continue
            ev = report.phases.eval
            # The job's clock: from the step end before it to the next step's begin holds the
            # evaluation (zeroscope's step end comes after the job's callback, and its eval
            # phase ends as evaluate() returns, before the next step begins) ...
            window = after["next_step_begin"] - after["after_step_end"]
            assert ev is not None and ev <= window, (report.step, ev, after)
            # ... and every batch but the first ran inside it.
            assert ev >= after["evaluated"] - after["first_batch_done"], (report.step, ev, after)
            # The training forward is the step's own, and the evaluation is not data loading.
            data, forward = report.phases.data, report.phases.forward
            assert forward is not None and forward < ev
            assert data is not None and data < ev, (report.step, report.phases)
            names = [p.name for p in report.phase_spans]
            assert names[:3] == ["data", "eval", "data"] and "forward" in names
