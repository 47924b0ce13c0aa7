"""Unmodified torch.amp jobs under ``zeroscope run``: tests/jobs/amp_train.py trains with fp16
autocast on the CPU and a dynamic loss scaler (``torch.amp.GradScaler("cpu")`` under DDP, FSDP's
``ShardedGradScaler`` under FSDP2), gradient accumulation (``no_sync()``) and non-reentrant
activation checkpointing; one launch runs a scale that grows and overflows and one so high that
every step overflows, on each engine. Oracles: the script's own account of each step (the mean
of the losses it handed to ``scaler.scale()``, the scale after ``update()``, and the scaler's
``found_inf`` for the step), and the same script under bare torchrun (losses, bit for bit)."""

from __future__ import annotations

import asyncio
import math

import pytest

from tests.attach_support import (
    JOBS,
    job_env,
    read_outputs,
    read_trace,
    run_plain,
    run_zeroscope,
    segments,
)
from zeroscope.agent.loss_scale import scale_text
from zeroscope.state import ClusterState
from zeroscope.store.trace import TraceReader

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SCRIPT = JOBS / "amp_train.py"
ALWAYS = 2.0**40
"""An initial scale every step overflows with in fp16: the scale halves per step and stays
far above fp16's range (65504) for the few steps run."""
RUNS = [
    ("ddp", 2.0**15, 1, 8),  # grows every clean step until it overflows, then backs off
    ("ddp", ALWAYS, 2000, 4),
    ("fsdp2", 2.0**15, 1, 6),
    ("fsdp2", ALWAYS, 2000, 3),
]
N = 2


def _spec(run: tuple[str, float, int, int]) -> str:
    mode, init, growth, steps = run
    return f"{mode}:{init:.0f}:{growth}:{steps}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("amp-attach")
    env = job_env()
    args = ["--runs", ",".join(_spec(r) for r in RUNS), "--accum", "2"]
    run_plain(SCRIPT, [*args, "--out", str(tmp / "plain")], env, timeout=600)
    done = run_zeroscope(SCRIPT, [*args, "--out", str(tmp / "zs")], env, tmp / "t.zstrace", 600)
    trace = read_trace(tmp / "t.zstrace")
    return {
        "plain": read_outputs(tmp / "plain"),
        "zs": read_outputs(tmp / "zs"),
        "trace": trace,
        "trace_path": tmp / "t.zstrace",
        "stdout": done.stdout,
        "steps": {rank: segments(trace[rank].steps, [r[3] for r in RUNS]) for rank in range(N)},
    }


def test_losses_are_bit_identical_with_and_without_zeroscope(runs: dict) -> None:
    for rank in range(N):
        assert runs["zs"][rank] == runs["plain"][rank]


def test_each_iteration_is_one_step_applied_or_skipped(runs: dict) -> None:
    for rank in range(N):
        for (mode, init, _, n), steps, own in zip(
            RUNS, runs["steps"][rank], runs["zs"][rank]["runs"], strict=True
        ):
            assert len(steps) == n == len(own)
            assert [s.skipped for s in steps] == [o["skipped"] for o in own], (mode, init)
            assert [s.overflow for s in steps] == [o["skipped"] for o in own], (mode, init)
            if init == ALWAYS:
                assert all(s.skipped for s in steps)
            else:  # the run shows both: clean steps that grow the scale and overflows
                assert any(o["skipped"] for o in own) and not all(o["skipped"] for o in own)


def test_loss_is_unscaled_mean_of_the_micro_batches(runs: dict) -> None:
    for rank in range(N):
        for steps, own in zip(runs["steps"][rank], runs["zs"][rank]["runs"], strict=True):
            for step, mine in zip(steps, own, strict=True):
                expected = float.fromhex(mine["loss"])
                assert step.loss is not None
                assert abs(step.loss - expected) <= 1e-6 * abs(expected)


def test_each_steps_gradient_norm_is_the_unscaled_norm_clipping_returned(runs: dict) -> None:
    """The script unscales and clips (``clip_grad_norm_``; under FSDP2 on DTensor gradients,
    whose norm torch returns replicated): each step's norm is the one it got, inf or nan where
    the step overflowed."""
    for rank in range(N):
        for steps, own in zip(runs["steps"][rank], runs["zs"][rank]["runs"], strict=True):
            for step, mine in zip(steps, own, strict=True):
                expected = float.fromhex(mine["grad_norm"])
                assert step.grad_norm is not None, (rank, step.step)
                if math.isnan(expected):
                    assert math.isnan(step.grad_norm) and mine["skipped"], (rank, step.step)
                else:
                    assert step.grad_norm == expected, (rank, step.step)
                    assert math.isfinite(expected) or mine["skipped"], (rank, step.step)


def test_loss_scale_after_each_step(runs: dict) -> None:
    for rank in range(N):
        for steps, own in zip(runs["steps"][rank], runs["zs"][rank]["runs"], strict=True):
            assert [s.loss_scale for s in steps] == [o["scale"] for o in own]


def test_loss_scale_events_follow_the_scalers_history(runs: dict) -> None:
    """Every overflow (at the scale the step's backward used) and every scale change (to the
    new scale), on the step they happened in; no minimum: the scale could still back off."""
    for rank in range(N):
        expected: list[tuple[int, str, float]] = []
        first = 1
        for (_, init, _, _), own in zip(RUNS, runs["zs"][rank]["runs"], strict=True):
            before = init
            for i, mine in enumerate(own):
                step = first + i
                if mine["skipped"]:
                    expected.append((step, "overflow", before))
                if mine["scale"] != before:
                    expected.append((step, "scale_change", mine["scale"]))
                before = mine["scale"]
            first += len(own)
        scale_kinds = ("overflow", "scale_change", "scale_at_minimum")
        got = [
            (e.step, e.event, e.value) for e in runs["trace"][rank].events if e.event in scale_kinds
        ]  # other events (the attach's own notes) aside
        assert got == expected


def test_summary_counts_the_skipped_steps(runs: dict) -> None:
    skipped = sum(o["skipped"] for run in runs["zs"][0]["runs"] for o in run)
    assert f"; {skipped} skipped;" in runs["stdout"]


def test_engines_named(runs: dict) -> None:
    for rank in range(N):
        engines = [h.engine for h in runs["trace"][rank].hellos]
        assert engines[0] == "ddp" and engines[-1] == "fsdp2"


def test_the_loss_scale_screen_shows_the_scalers_history(runs: dict) -> None:
    """fp32 parameters under fp16 autocast (the Hello says fp32): the screen still draws the
    scale the scaler reported, the skipped count and the events."""
    from zeroscope.tui.app import ZeroscopeApp
    from zeroscope.tui.loss_scale_screen import LossScaleScreen

    state = ClusterState()
    with TraceReader(runs["trace_path"]) as reader:
        state.ingest_all(list(reader.messages()))
    own = runs["zs"][0]["runs"][-1]  # the last run (FSDP2) is the one the state is on
    total = sum(r[3] for r in RUNS)
    skipped = sum(o["skipped"] for run in runs["zs"][0]["runs"] for o in run)

    async def look() -> str:
        app = ZeroscopeApp(state)
        async with app.run_test(size=(120, 50)) as pilot:
            await pilot.press("l")
            assert isinstance(app.screen, LossScaleScreen)
            return "\n".join(strip.text for strip in app.screen._compositor.render_strips())

    text = asyncio.run(look())
    assert f"{skipped} of {total} steps skipped" in text
    assert "no loss scaling" not in text
    assert f"gradient overflow at loss scale {scale_text(own[-2]['scale'])}: step skipped" in text


def test_summary_and_export_carry_every_overflow(runs: dict) -> None:
    from zeroscope.commands.export import chrome_events
    from zeroscope.commands.summary import summarize

    skipped = [sum(o["skipped"] for run in runs["zs"][r]["runs"] for o in run) for r in range(N)]
    rows = summarize(runs["trace_path"])["ranks"]
    assert [row["overflows"] for row in sorted(rows, key=lambda row: row["rank"])] == skipped
    instants = [e for e in chrome_events(runs["trace_path"]) if e.get("ph") == "i"]
    for rank in range(N):
        overflows = [e for e in instants if e["pid"] == rank and e["name"] == "overflow"]
        assert len(overflows) == skipped[rank]
