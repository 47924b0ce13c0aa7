"""The attach's GradScaler wrappers in one process, no launcher: a plain loop with two
micro-batches per step whose gradients are made finite or not on purpose, with an optimizer the
scaler skips itself (SGD: the skip known on the host) and one that applies the scaling itself
(fused Adam, ``_step_supports_amp_scaling``: the skip read from the scaler's ``found_inf``).
Each case runs in a fresh interpreter (the attach patches classes process-wide); the reports go
to an in-memory publisher. Answers: the loop's own losses, ``get_scale()`` and ``found_inf``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent(
    """
    import json, sys, torch
    from zeroscope.agent.attach import grad_scaler, torch_loop
    from zeroscope.agent.attach.session import SESSION
    from zeroscope.agent.live import LiveTelemetry
    from zeroscope.agent.schema import Event, StepReport
    from tests.test_agent_timeline import Sink

    sink = Sink()
    tel = LiveTelemetry(sink, sample_interval=60.0)
    tel.sampler.stop()
    SESSION.tel = tel  # the agent the attach would start, publishing to memory
    torch_loop.install()
    grad_scaler.install()
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4))
    fused = sys.argv[1] == "fused"
    opt = torch.optim.Adam([w], lr=0.1, fused=True) if fused else torch.optim.SGD([w], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=64.0, growth_interval=2)
    own = []
    for bad in (False, True, False, False, True, False):
        losses = []
        for m in range(2):
            loss = (w * (m + 1)).pow(2).mean()
            scaler.scale(loss).backward()
            losses.append(loss.item())
        if bad:
            w.grad[0] = float("inf")
        scaler.step(opt)
        found = sum(v.item() for v in scaler._found_inf_per_device(opt).values())
        scaler.update()
        opt.zero_grad()
        own.append([sum(losses) / 2, scaler.get_scale(), bool(found)])
    tel.drain()
    tel.close()
    reports = [
        [m.loss, m.loss_scale, m.skipped, m.overflow] for m in sink.sent if isinstance(m, StepReport)
    ]
    events = [[m.step, m.event, m.value] for m in sink.sent if isinstance(m, Event)]
    print(json.dumps({"own": own, "reports": reports, "events": events, "errors": SESSION.errors}))
    """
)


@pytest.mark.parametrize("optimizer", ["sgd", "fused"])
def test_steps_losses_scales_and_skips_match_the_loops_own(optimizer: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, optimizer],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    own, reports = out["own"], out["reports"]
    assert out["errors"] == 0
    assert any(skipped for *_, skipped in own) and not all(skipped for *_, skipped in own)
    assert len(reports) == len(own)  # one step per scaler step, applied or skipped
    for (loss, scale, skipped), (r_loss, r_scale, r_skipped, r_overflow) in zip(
        own, reports, strict=True
    ):
        assert abs(r_loss - loss) <= 1e-6 * abs(loss)  # unscaled: not loss x scale
        assert (r_scale, r_skipped, r_overflow) == (scale, skipped, skipped)
    expected, before = [], 64.0
    for step, (_, scale, skipped) in enumerate(own, start=1):
        if skipped:
            expected.append([step, "overflow", before])
        if scale != before:
            expected.append([step, "scale_change", scale])
        before = scale
    assert out["events"] == expected
