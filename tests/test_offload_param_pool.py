"""Stage 3 with the parameters in NVMe files: each fetch reads into a ring of page-locked
buffers instead of pinning a new one.

- **No page-locked allocation per step**: every page-locked buffer the offload modules ask for
  is counted (``host_empty(pin=True)`` in each module that calls it); after the first step the
  count per step is 0. Before, every gather of every step pinned a new buffer (and every step
  pinned a staging copy of the whole shard for the file rewrite).
- **The same training**: the parameters after four steps are bit-identical to the run without
  offload (Adam is the same function; a reused buffer must never hand a gather stale bytes).
- **The guard**: a ring buffer is refilled only after the device copy that read it completed
  (the device is a clock the test drives, as in tests/test_nvme_pool_guard.py).
- **Bounded**: ``buffer_count`` buffers of ``min(buffer_size, shard)`` elements, grown once to a
  fetch larger than that.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.offload_support import build, ds_config, train
from zeroscope.engine import nvme, offload_copy, offload_param

SMALL = {"stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 0}


@pytest.fixture(autouse=True)
def one_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "ZEROSCOPE_WORLD1_COLLECTIVES"):
        monkeypatch.delenv(name, raising=False)


def _param_nvme(folder: Path, **param: Any) -> dict[str, Any]:
    return ds_config(
        3,
        "bf16",
        **SMALL,
        offload_optimizer={"device": "cpu", "pin_memory": True},
        offload_param={"device": "nvme", "nvme_path": str(folder), **param},
    )


def test_no_page_locked_allocation_per_step_after_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pinned: list[int] = []
    for module in (offload_param, nvme, offload_copy):
        real = module.host_empty

        def counted(numel: int, dtype: torch.dtype, *, pin: bool, _real: Any = real) -> Any:
            if pin:
                pinned.append(numel)
            return _real(numel, dtype, pin=pin)

        monkeypatch.setattr(module, "host_empty", counted)
    run = build(_param_nvme(tmp_path, buffer_count=3))
    per_step = []
    for step in range(4):
        before = len(pinned)
        train(run, 0, 1, range(step, step + 1))
        per_step.append(len(pinned) - before)
    gathers = sum(1 for d, *_ in run.recorder.transfers[3] if d == "nvme_read")
    run.engine.destroy()
    assert gathers > 3  # the step fetched more often than the ring has buffers
    assert per_step[1:] == [0, 0, 0], per_step


def test_nvme_parameters_train_bit_identically_to_no_offload(tmp_path: Path) -> None:
    params = {}
    for name, cfg in {
        "none": ds_config(3, "bf16", **SMALL),
        "nvme": _param_nvme(tmp_path, buffer_count=2),
    }.items():
        run = build(cfg)
        train(run, 0, 1, range(4))
        params[name] = run.engine._zero3_consolidated_16bit_state_dict()
        run.engine.destroy()
    assert params["none"].keys() == params["nvme"].keys() and len(params["none"]) > 4
    for key, value in params["none"].items():
        assert value.numel() and torch.equal(value, params["nvme"][key]), key


class CopyEnd:
    """A host-to-device copy's end event on a device the test drives."""

    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name, self.done = log, name, False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.log.append(f"waited {self.name}")
        self.done = True


def test_a_ring_buffer_is_refilled_only_after_its_copy_landed(tmp_path: Path) -> None:
    run = build(_param_nvme(tmp_path, buffer_count=2, buffer_size=64))
    home = run.engine.strategy.params
    log: list[str] = []
    copies = iter(range(1, 100))

    class DrivenCopier:
        last_event: Any = None

        def copy(self, direction: Any, dst: torch.Tensor, src: torch.Tensor, label: str) -> None:
            log.append(f"read into {src.untyped_storage().data_ptr()}")
            dst.copy_(src)
            self.last_event = CopyEnd(log, f"copy {next(copies)}")

    home.copier = DrivenCopier()
    got = [home.fetch_span(0, 10) for _ in range(3)]
    assert all(torch.equal(g, got[0]) for g in got)
    first, second, third = (e for e in log if e.startswith("read"))
    # Two buffers: the third fetch reuses the first's buffer, after waiting for its copy.
    assert first == third != second
    reads = [i for i, e in enumerate(log) if e.startswith("read")]
    assert reads[1] < log.index("waited copy 1") < reads[2] and "waited copy 2" not in log
    assert home.reads.nbytes == 2 * 64 * 2  # buffer_count x buffer_size bf16 elements
    home.fetch_span(0, 100)  # a fetch larger than buffer_size grows its buffer, once
    assert sorted(b.numel() for b in home.reads.buffers) == [64, 100]
    run.engine.destroy()


@pytest.mark.gpu
def test_gpu_nvme_parameters_with_one_ring_buffer_train_like_no_offload(tmp_path: Path) -> None:
    """One page-locked ring buffer: every gather's file read refills the buffer the previous
    gather's non-blocking copy to the GPU read. Without the end-event guard the read would
    overwrite bytes still in flight (wrong parameters, no error). Before, every gather pinned a
    fresh buffer: the per-gather allocation this ring removes."""
    params = {}
    for name, cfg in {
        "none": ds_config(3, "bf16", **SMALL),
        "nvme": _param_nvme(tmp_path, buffer_count=1),
    }.items():
        run = build(cfg)
        train(run, 0, 1, range(4))
        params[name] = {
            k: v.cpu() for k, v in run.engine._zero3_consolidated_16bit_state_dict().items()
        }
        run.engine.destroy()
    for key, value in params["none"].items():
        assert torch.equal(value, params["nvme"][key]), key
