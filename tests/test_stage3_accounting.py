"""Stage 3 bytes against the ZeRO formulas, computed here from the plain model: model-state
memory per rank, the gathered-parameter cap, per-step communication volume, and the
consolidated 16-bit save."""

from __future__ import annotations

import logging
import math
import os
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.distributed import run_ranks
from tests.test_stage3 import _strategy
from tests.test_stage3_support import Hyper, Recorder, batches, make_model, train_stage3

THRESHOLD = 128  # LayerNorm weights/biases and Linear biases are persistent, matrices are not
BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def _layout(world: int, threshold: int, **model_kw: Any) -> dict[str, int]:
    """Element counts of the plain model (tied weights once), padded per parameter to a
    multiple of N, split into persistent (numel <= threshold) and sharded."""
    model = make_model(**model_kw)
    pad = {p: math.ceil(p.numel() / world) * world for p in model.parameters()}
    persistent = [p for p in pad if p.numel() <= threshold]
    largest_module = max(
        sum(pad[p] for p in m.parameters(recurse=False) if p.numel() > threshold)
        for m in model.modules()
    )
    return {
        "padded": sum(pad.values()),
        "persistent": sum(p.numel() for p in persistent),
        "persistent_padded": sum(pad[p] for p in persistent),
        "sharded_padded": sum(v for p, v in pad.items() if p.numel() > threshold),
        "head_weight_padded": pad[model.head.weight],
        "largest_module": largest_module,
    }


def _memory_run(rank: int, world: int, precision: str) -> tuple[Any, int, list[int]]:
    dist.init_process_group("gloo")
    model = make_model()
    strategy = _strategy(
        model,
        precision,
        stage3_param_persistence_threshold=THRESHOLD,
        stage3_max_live_parameters=3000,
        stage3_prefetch_bucket_size=2500,
    )
    run = train_stage3(
        strategy,
        model,
        batches(3, 1, rows=2 * world),
        Hyper(),
        rank=rank,
        world=world,
        precision=precision,
    )
    # Between uses every sharded parameter is an empty placeholder.
    held = [p.numel() for p in model.parameters()]
    peak = max(m.gathered_params for m in run.steps_memory)
    return run.steps_memory[-1], peak, held


@pytest.mark.parametrize(("world", "precision"), [(2, "bf16"), (4, "fp16"), (2, "fp32")])
def test_model_state_bytes_are_16_psi_over_n_plus_persistent(world: int, precision: str) -> None:
    e = BYTES[precision]
    lay = _layout(world, THRESHOLD)
    shard = lay["padded"] // world
    master = 4 if e == 2 else 0  # fp32 training: the shard is its own master
    for memory, peak, held in run_ranks(_memory_run, world, precision):
        assert memory.params == e * shard + e * lay["persistent"]
        assert memory.persistent_params == e * lay["persistent"]
        assert memory.grads == e * shard
        assert memory.optim == (master + 8) * shard
        total = memory.params + memory.grads + memory.optim
        if e == 2:
            assert total == 16 * lay["padded"] // world + 2 * lay["persistent"]
        else:
            assert total == 16 * lay["padded"] // world + 4 * lay["persistent"]
        # Gathered elements never exceeded max_live_parameters plus the module running.
        assert 0 < peak <= e * (3000 + lay["largest_module"])
        assert held == [
            p.numel() if p.numel() <= THRESHOLD else 0 for p in make_model().parameters()
        ]


def _comm_run(rank: int, world: int, knobs: dict) -> list[dict[str, int]] | list[Any]:
    dist.init_process_group("gloo")
    model = make_model(tie=False)
    recorder = Recorder()
    strategy = _strategy(
        model, "fp32", recorder, stage3_param_persistence_threshold=THRESHOLD, **knobs
    )
    run = train_stage3(
        strategy,
        model,
        batches(3, 1, rows=2 * world),
        Hyper(),
        rank=rank,
        world=world,
        precision="fp32",
        recorder=recorder,
    )
    return [run.comm_per_step, sum(1 for r in recorder.records if r[2])]


@pytest.mark.parametrize("reuse", [0, 1, 10**9])
def test_step_moves_3_psi_minus_persistence_and_reuse(reuse: int) -> None:
    """Forward all-gathers every sharded parameter, backward again (less what reuse keeps),
    reduce-scatter every gradient, one all-gather of the persistent ones after the step.
    The first step records the trace and releases everything: the full 3 Psi form."""
    lay = _layout(2, THRESHOLD, tie=False)
    e = 4
    full_ag = e * (2 * lay["sharded_padded"] + lay["persistent_padded"])
    saved = {0: 0, 1: lay["head_weight_padded"], 10**9: lay["sharded_padded"]}[reuse]
    knobs = {"stage3_max_reuse_distance": reuse, "stage3_prefetch_bucket_size": 0}
    per_step, prefetched = run_ranks(_comm_run, 2, knobs)[0]
    assert per_step[0] == {"all_gather": full_ag, "reduce_scatter": e * lay["padded"]}
    for step in per_step[1:]:
        assert step == {"all_gather": full_ag - e * saved, "reduce_scatter": e * lay["padded"]}
    assert prefetched == 0


def test_prefetch_moves_no_more_and_is_reported_as_prefetched() -> None:
    lay = _layout(2, THRESHOLD, tie=False)
    e = 4
    knobs = {"stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 3000}
    per_step, prefetched = run_ranks(_comm_run, 2, knobs)[0]
    lowest = e * (lay["sharded_padded"] + lay["persistent_padded"])
    for step in per_step[1:]:
        assert (
            lowest
            <= step["all_gather"]
            <= e * (2 * lay["sharded_padded"] + lay["persistent_padded"])
        )
        assert step["reduce_scatter"] == e * lay["padded"]
    assert prefetched > 0


def _save_run(rank: int, world: int, folder: str) -> tuple[bool, bool, list[str], Any]:
    dist.init_process_group("gloo")
    messages: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    logging.getLogger("zeroscope").addHandler(Keep())
    results = []
    for gather in (False, True):
        model = make_model()
        strategy = _strategy(
            model,
            "bf16",
            stage3_param_persistence_threshold=THRESHOLD,
            stage3_gather_16bit_weights_on_model_save=gather,
        )
        data = batches(3, 1, rows=2 * world)
        train_stage3(strategy, model, data, Hyper(), rank=rank, world=world, precision="bf16")
        results.append(strategy.save_16bit_model(os.path.join(folder, str(gather))))
    with torch.no_grad():
        idx, tgt = batches(1, 1, rows=3, seed=7)[0][0]
        out = model(idx, tgt)
    return results[0], results[1], messages, out.item()


def test_save_16bit_model_consolidates_full_weights(tmp_path: Any) -> None:
    from zeroscope.engine.zero.stage3.save import load_16bit_model

    ranks = run_ranks(_save_run, 2, str(tmp_path))
    for rank, (off, on, messages, _) in enumerate(ranks):
        assert off is False and on is True
        assert any("stage3_gather_16bit_weights_on_model_save" in m for m in messages) == (
            rank == 0
        )
    assert not (tmp_path / "False").exists()
    state = load_16bit_model(tmp_path / "True" / "pytorch_model.bin")
    plain = make_model().to(torch.bfloat16)
    plain.load_state_dict(state, strict=True)
    assert plain.head.weight.data_ptr() == plain.wte.weight.data_ptr()  # still tied
    with torch.no_grad():
        idx, tgt = batches(1, 1, rows=3, seed=7)[0][0]
        assert plain(idx, tgt).item() == ranks[0][3]
    assert state["wte.weight"].dtype == torch.bfloat16
