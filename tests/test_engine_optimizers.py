"""One process against plain torch: torch optimizers other than Adam(W) on the engine's fp32
shards (client SGD with momentum, ds_config Adagrad), DeepSpeed's own optimizer types refused
in one line, and a tied head read in the root's forward at stage 3 with persistence 0 (the
weight is partitioned when the root reads it; the engine must gather it unregistered).
DeepSpeed itself is compared in tests/test_differential_scripts.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from tests.differential.models import TiedHeadScript, micro_batches
from tests.recorder import RecordingTelemetry
from zeroscope.agent.api import set_telemetry
from zeroscope.engine.api import ConfigError, initialize


@pytest.fixture(autouse=True)
def recorder() -> Iterator[RecordingTelemetry]:
    rec = RecordingTelemetry()
    set_telemetry(rec)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield rec
    torch.set_num_threads(threads)
    set_telemetry(None)


def _config(stage: int, optimizer: dict[str, Any] | None = None) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
    }
    if optimizer is not None:
        cfg["optimizer"] = optimizer
    return cfg


def _train_both(engine: Any, ref: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    data = micro_batches(8, 0, 1)
    for k, (x, y) in enumerate(data):
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        expected = ref(x, y)
        (expected / 2).backward()
        if k % 2 == 1:
            opt.step()
            opt.zero_grad()
        assert float(loss.detach()) == pytest.approx(float(expected.detach()), rel=1e-5)


def _weights(engine: Any) -> dict[str, torch.Tensor]:
    if engine.zero_optimization_stage() == 3:
        return engine.strategy.consolidated_16bit_state_dict()
    return engine.module.state_dict()


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_client_sgd_with_momentum_steps_the_shards_like_torch(stage: int) -> None:
    torch.manual_seed(0)
    model = TiedHeadScript()
    client = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, dampening=0.1)
    engine, optimizer, *_ = initialize(model=model, optimizer=client, config=_config(stage))
    torch.manual_seed(0)
    ref = TiedHeadScript()
    opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9, dampening=0.1)
    _train_both(engine, ref, opt)
    ours = _weights(engine)
    for name, value in ref.state_dict().items():
        torch.testing.assert_close(ours[name], value, rtol=1e-5, atol=1e-6)
    assert optimizer.param_groups[0]["momentum"] == 0.9


@pytest.mark.parametrize("stage", [1, 3])
def test_config_adagrad_is_torchs(stage: int) -> None:
    torch.manual_seed(0)
    engine, *_ = initialize(
        model=TiedHeadScript(),
        config=_config(stage, {"type": "Adagrad", "params": {"lr": 0.05, "weight_decay": 0.01}}),
    )
    torch.manual_seed(0)
    ref = TiedHeadScript()
    opt = torch.optim.Adagrad(ref.parameters(), lr=0.05, weight_decay=0.01)
    _train_both(engine, ref, opt)
    ours = _weights(engine)
    for name, value in ref.state_dict().items():
        torch.testing.assert_close(ours[name], value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["Lamb", "Lion", "OneBitAdam", "ZeroOneAdam", "NoSuchOpt"])
def test_optimizers_torch_lacks_are_refused_in_one_line(name: str) -> None:
    with pytest.raises(ConfigError) as err:
        initialize(model=TiedHeadScript(), config=_config(1, {"type": name, "params": {}}))
    message = str(err.value)
    assert "\n" not in message and name in message and "Lamb, Lion" in message


def test_another_optimizer_with_offload_is_refused() -> None:
    cfg = _config(2, {"type": "SGD", "params": {"lr": 0.1}})
    cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    with pytest.raises(ConfigError, match="offload steps Adam"):
        initialize(model=TiedHeadScript(), config=cfg)


def test_tied_head_read_in_the_parents_forward_at_stage3_persistence0() -> None:
    """Without the getter the root reads an empty placeholder: "size mismatch ... vec (0)"."""
    torch.manual_seed(0)
    engine, *_ = initialize(
        model=TiedHeadScript(),
        config=_config(3, {"type": "AdamW", "params": {"lr": 0.02, "torch_adam": True}}),
    )
    torch.manual_seed(0)
    ref = TiedHeadScript()
    opt = torch.optim.AdamW(ref.parameters(), lr=0.02)
    _train_both(engine, ref, opt)
    ours = _weights(engine)
    for name, value in ref.state_dict().items():
        torch.testing.assert_close(ours[name], value, rtol=1e-5, atol=1e-6)
    # found, registered to the root, and released after use like the root's own parameters
    assert engine.module.tok.weight.numel() == 0
