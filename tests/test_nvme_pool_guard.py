"""The NVMe optimizer store's pool buffers are refilled only once the parameter copy that reads
them has completed.

With fp32 parameters the updated master goes to the device straight from its pool buffer
(page-locked, ``non_blocking=True``): the copy reads the buffer after the host moved on. Before,
the buffer went back to the pool as soon as its write to disk finished, and the next unit's
read-ahead could overwrite it while the copy was still in flight (wrong parameters, no error).
Now each buffer goes back with the copy's end event as a guard, and taking it waits for it.

On the CPU the device is a clock the test drives: an event completes when the test says, and a
refill of a buffer whose guard has not completed is a failure.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.recorder import RecordingTelemetry
from zeroscope.engine.nvme import BufferPool, NvmeSwapper
from zeroscope.engine.offload_store import NvmeStore
from zeroscope.engine.optim import AdamHyper, AdamState
from zeroscope.engine.zero.strategy import Shard


class CopyEnd:
    """A host-to-device copy's end event on a device the test drives."""

    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name, self.done = log, name, False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.log.append(f"waited {self.name}")
        self.done = True


def test_a_guarded_buffer_is_taken_only_after_its_copy_completed() -> None:
    log: list[str] = []
    pool = BufferPool(1, 4, dtype=torch.float32, pin=False)
    index = pool.take()
    assert index == 0
    pool.give(0, CopyEnd(log, "copy 1"))
    assert pool.take() == 0 and log == ["waited copy 1"]
    done = CopyEnd(log, "copy 2")
    done.done = True  # already landed: nothing to wait for
    pool.give(0, done)
    assert pool.take() == 0 and log == ["waited copy 1"]


def test_each_unit_refills_its_buffer_after_the_previous_units_copy(tmp_path: Path) -> None:
    log: list[str] = []
    n = 12
    master = torch.arange(n, dtype=torch.float32)
    shard = Shard(master=master.clone(), state=AdamState.zeros_like(master), group=0)
    swapper = NvmeSwapper(str(tmp_path), rank=0, purpose="optim", tel=RecordingTelemetry())
    # Units of 4 elements, one pool buffer: every unit after the first reuses it.
    store = NvmeStore([shard], swapper=swapper, buffer_count=1, unit_numel=4, pin=False)
    read = swapper.read

    def watched_read(unit: str, out: torch.Tensor) -> object:
        log.append(f"refill {unit}")
        return read(unit, out)

    swapper.read = watched_read  # type: ignore[method-assign]
    copies: list[CopyEnd] = []

    def write_param(i: int, lo: int, chunk: torch.Tensor) -> CopyEnd:
        copies.append(CopyEnd(log, f"copy {lo}"))
        return copies[-1]

    store.step([torch.ones(n)], lambda g: AdamHyper(lr=0.1), write_param)
    assert log == [
        "refill optim-s0-0",
        "waited copy 0",
        "refill optim-s0-4",
        "waited copy 4",
        "refill optim-s0-8",
    ]


@pytest.mark.gpu
def test_gpu_nvme_optimizer_with_fp32_parameters_trains_like_no_offload(tmp_path: Path) -> None:
    """Stage 2, fp32, O in NVMe with one page-locked pool buffer and small units, against the
    same run without offload: Adam is elementwise, so the parameters must be equal. Before, a
    unit's read-ahead could overwrite the buffer while the previous unit's non-blocking copy to
    the GPU still read it: parameters from the next unit's bytes (a race: not every run)."""
    from tests.offload_support import build, ds_config, train

    nvme = {"device": "nvme", "nvme_path": str(tmp_path), "buffer_count": 1, "pin_memory": True}
    configs = {
        "none": ds_config(2),
        "nvme": ds_config(2, offload_optimizer=nvme, sub_group_size=4096),
    }
    params = {}
    for name, cfg in configs.items():
        run = build(cfg)
        train(run, 0, 1, range(4))
        params[name] = [p.detach().cpu().clone() for p in run.engine.module.parameters()]
        run.engine.destroy()
    for a, b in zip(params["none"], params["nvme"], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
