"""``ZEROSCOPE_WORLD1_COLLECTIVES=1``: the engine's real collectives at world size 1, so one GPU
exercises NCCL and the agent's collective timing. Checked at world 1 with gloo:

- without the switch a one-rank run issues no collective at all (the engine skips them);
- with it, every step issues the collectives the stage issues on N ranks (stage 0: all-reduce of
  the gradients; stages 1-2: reduce-scatter of the gradients, the gradient-norm all-reduce and
  the all-gather of the parameters; stage 3: all-gathers of the parameters, reduce-scatters of
  the gradients, the norm all-reduce; fp16 adds the overflow all-reduce), each over a group of
  one, and the initial broadcast of the weights is issued too;
- the losses and final weights are bit-for-bit those of the run without the switch (a sum over
  one rank is the tensor itself), for fp32, bf16 and fp16;
- with no torchrun environment at all (a plain ``python train.py``) the switch makes a one-rank
  process group itself.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from tests.distributed import run_ranks
from tests.models import TinyGPT, batches
from tests.offload_support import ds_config

ENV = "ZEROSCOPE_WORLD1_COLLECTIVES"
EXPECTED = {
    0: {"all_reduce"},
    1: {"reduce_scatter", "all_reduce", "all_gather"},
    2: {"reduce_scatter", "all_reduce", "all_gather"},
    3: {"reduce_scatter", "all_reduce", "all_gather"},
}


def _run(stage: int, precision: str, force: bool) -> dict[str, Any]:
    import torch.distributed as dist

    from tests.recorder import RecordingTelemetry
    from zeroscope.agent.api import set_telemetry
    from zeroscope.engine.api import initialize

    if force:
        os.environ[ENV] = "1"
    else:
        os.environ.pop(ENV, None)
    rec = RecordingTelemetry()
    set_telemetry(rec)
    torch.manual_seed(0)
    model = TinyGPT()
    zero = {"stage3_param_persistence_threshold": 0} if stage == 3 else {}
    cfg = ds_config(stage, precision, **zero)
    if precision == "fp16":  # a scale that does not overflow: every step is taken
        cfg["fp16"]["initial_scale_power"] = 8
    engine, *_ = initialize(model=model, config=cfg)
    losses = []
    for x, y in batches(3, 2, seed=2):
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    if stage == 3:
        weights = engine.strategy.consolidated_16bit_state_dict()
    else:
        weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return {
        "losses": losses,
        "weights": weights,
        "init": [(c.op, c.group_size) for c in rec.init_collectives],
        "steps": [[(c.op, c.group_size) for c in s.collectives] for s in rec.steps],
        "group": dist.is_initialized(),
    }


def _world1(rank: int, world: int) -> dict[str, Any]:
    out = {}
    for stage in (0, 1, 2, 3):
        for precision in ("fp32", "bf16", "fp16"):
            plain, forced = _run(stage, precision, False), _run(stage, precision, True)
            a, b = plain.pop("weights"), forced.pop("weights")
            # (compared here: tensors do not travel back from a finished rank)
            plain["same_weights"] = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
            out[f"{stage}-{precision}"] = (plain, forced)
    return out


def test_forced_world1_collectives_are_issued_and_change_no_number() -> None:
    (res,) = run_ranks(_world1, 1, timeout=600)
    for name, (plain, forced) in res.items():
        stage = int(name.split("-")[0])
        assert plain["init"] == [] and all(s == [] for s in plain["steps"]), name
        assert {op for op, _ in forced["init"]} == {"broadcast"}, name
        for ops in forced["steps"]:
            expected = EXPECTED[stage] | ({"all_reduce"} if name.endswith("fp16") else set())
            assert {op for op, _ in ops} == expected, name
            assert {size for _, size in ops} == {1}, name
        assert forced["losses"] == plain["losses"], name
        assert plain["same_weights"], name


def _no_torchrun(rank: int, world: int) -> dict[str, Any]:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(name, None)
    out = _run(2, "fp32", force=True)
    del out["weights"]
    return out


def test_forced_world1_collectives_without_torchrun_make_their_own_group() -> None:
    (res,) = run_ranks(_no_torchrun, 1, timeout=300)
    assert res["group"]
    assert all({op for op, _ in ops} == EXPECTED[2] for ops in res["steps"])
