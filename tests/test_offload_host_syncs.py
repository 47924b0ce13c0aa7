"""ZeRO-Offload (optimizer on the host, parameters on the device) waits for the device once per
step: for the gradients CPU Adam is about to read. Writing the updated parameters back takes no
host sync: the next forward's kernels follow the copies on the same stream, and every
page-locked source a copy reads is guarded by its end event.

Before, the step flushed the copier twice (after the gradients, and again after the parameter
copies), a second host stall per step that only stream order needed. The CPU test counts the
copier's flushes on a real stage-2 offload run; the GPU one counts every event, stream and device
synchronization a steady step takes inside the engine's calls.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.offload_support import build, ds_config, train
from zeroscope.engine.offload_copy import Copier


def _flushes(monkeypatch: pytest.MonkeyPatch, config: dict[str, Any]) -> list[int]:
    calls: list[int] = []
    flush = Copier.flush

    def counted(self: Copier) -> None:
        calls.append(1)
        flush(self)

    monkeypatch.setattr(Copier, "flush", counted)
    run = build(config)
    per_step = []
    for k in range(3):
        before = len(calls)
        train(run, 0, 1, range(k, k + 1))
        per_step.append(len(calls) - before)
    run.engine.destroy()
    return per_step


def test_optimizer_offload_flushes_once_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = ds_config(2, offload_optimizer={"device": "cpu"})
    assert _flushes(monkeypatch, cfg) == [1, 1, 1]


def test_with_parameters_on_the_host_the_writes_are_flushed_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Stage 3 with P offloaded: the host reads what the parameter copies wrote.
    cfg = ds_config(3, offload_optimizer={"device": "cpu"}, offload_param={"device": "cpu"})
    assert _flushes(monkeypatch, cfg) == [2, 2, 2]


@pytest.mark.gpu
def test_gpu_optimizer_offload_takes_one_host_sync_per_steady_step() -> None:
    """Before: two event synchronizations per step (the gradients', then the parameters')."""
    counts: list[int] = []
    real = torch.cuda.Event.synchronize

    def counted(self: Any) -> None:
        counts.append(1)
        real(self)

    run = build(ds_config(2, offload_optimizer={"device": "cpu"}))
    train(run, 0, 1, range(2))
    torch.cuda.synchronize()
    torch.cuda.Event.synchronize = counted  # type: ignore[method-assign]
    try:
        train(run, 0, 1, range(2, 4))
    finally:
        torch.cuda.Event.synchronize = real  # type: ignore[method-assign]
    run.engine.destroy()
    assert len(counts) == 2  # one per step
