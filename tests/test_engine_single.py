"""The engine as one plain process (no torchrun, no process group): DeepSpeed's API surface,
the LR schedule wiring, client optimizers and torch schedulers, the data loader, hello."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch

from tests.models import TinyGPT, batches, param_count
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


def test_one_process_stage2_with_warmup_lr_matches_adamw(recorder: RecordingTelemetry) -> None:
    cfg = {
        "train_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "zero_optimization": {"stage": 2, "overlap_comm": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.02, "eps": 1e-5}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 4, "warmup_max_lr": 0.02}},
    }
    torch.manual_seed(0)
    engine, optimizer, _, sched = initialize(model=TinyGPT(), config=cfg)
    assert (engine.train_batch_size(), engine.gradient_accumulation_steps()) == (4, 2)
    assert engine.train_micro_batch_size_per_gpu() == 2 and engine.world_size == 1
    torch.manual_seed(0)
    ref = TinyGPT()
    opt = torch.optim.AdamW(ref.parameters(), lr=0.02, eps=1e-5, weight_decay=0.0)
    data = batches(6, 4, seed=3)
    lrs = []
    for step, (x, y) in enumerate(data):
        lrs.append(engine.get_lr()[0])
        for k in range(2):
            assert engine.is_gradient_accumulation_boundary() == (k == 1)
            engine.backward(engine(x[2 * k : 2 * k + 2], y[2 * k : 2 * k + 2]))
            engine.step()
        assert engine.global_steps == step + 1
        # reference: DeepSpeed's WarmupLR (log) evaluated at the iteration before this step
        opt.param_groups[0]["lr"] = 0.02 * (
            math.log(step) / math.log(4) if 0 < step < 4 else step >= 4
        )
        opt.zero_grad()
        for k in range(2):
            (ref(x[2 * k : 2 * k + 2], y[2 * k : 2 * k + 2]) / 2).backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        opt.step()
    assert lrs == pytest.approx([0.0, 0.0, 0.01, 0.02 * math.log(3) / math.log(4), 0.02, 0.02])
    for (name, p), q in zip(engine.module.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=0, msg=name)
    assert sched is not None and optimizer.param_groups[0]["lr"] == 0.02
    assert len(recorder.hellos) == 1
    hello = recorder.hellos[0]
    assert hello["config"].stage == 2 and hello["config"].overlap_comm is True
    assert hello["params"].total == param_count(TinyGPT())
    assert len(recorder.steps) == 6 and recorder.steps[0].collectives == []  # one rank: none


def test_client_adamw_torch_scheduler_and_dataloader() -> None:
    torch.manual_seed(0)
    model = TinyGPT()
    client = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.5)
    data = list(zip(*batches(1, 6)[0]))
    engine, optimizer, loader, sched = initialize(
        model=model,
        optimizer=client,
        training_data=data,
        lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5**s),
        config={"train_micro_batch_size_per_gpu": 3},
    )
    assert optimizer.decoupled and optimizer.param_groups[0]["weight_decay"] == 0.5
    sizes = [len(x) for x, _ in loader]
    assert sizes == [3, 3]
    for x, y in loader:
        engine.backward(engine(x, y))
        engine.step()  # steps the scheduler too, as DeepSpeed does with a passed lr_scheduler
    assert engine.get_lr() == [pytest.approx(0.025)] and sched.last_epoch == 2


def test_scheduler_built_on_the_client_optimizer_drives_the_engine() -> None:
    model = TinyGPT()
    client = torch.optim.Adam(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(client, step_size=1, gamma=0.1)
    engine, _, _, returned = initialize(
        model=model, optimizer=client, lr_scheduler=sched, config={"train_batch_size": 2}
    )
    assert returned is sched and not engine.optimizer.decoupled
    x, y = batches(1, 2)[0]
    engine.backward(engine(x, y))
    engine.step()
    assert engine.get_lr() == [pytest.approx(0.01)]


def test_optimizer_given_twice_or_missing_is_an_error() -> None:
    model = TinyGPT()
    with pytest.raises(ConfigError, match="both in ds_config and to initialize"):
        initialize(
            model=model,
            optimizer=torch.optim.Adam(model.parameters()),
            config={"train_batch_size": 2, "optimizer": {"type": "Adam"}},
        )
    with pytest.raises(ConfigError, match="no optimizer"):
        initialize(model=TinyGPT(), config={"train_batch_size": 2})


def test_deepspeed_module_surface_for_porting(tmp_path) -> None:
    """``import zeroscope.engine.api as deepspeed`` keeps a DeepSpeed script's calls working."""
    import argparse

    import zeroscope.engine.api as deepspeed

    path = tmp_path / "ds_config.json"
    path.write_text('{"train_batch_size": 2, "optimizer": {"type": "Adam"}} // comment')
    parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--deepspeed", "--deepspeed_config", str(path)])
    deepspeed.init_distributed()  # no torchrun environment: one rank, nothing to do
    engine, _, _, _ = deepspeed.initialize(args=args, model=TinyGPT())
    assert engine.train_batch_size() == 2 and engine.optimizer.name == "Adam"


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_strategy_state_dict_resumes_exactly(precision: str) -> None:
    """Masters, Adam moments and step counts are the whole optimizer state a checkpoint needs:
    2 steps, save, a fresh engine loads it, 2 more steps == 4 uninterrupted steps, bitwise."""
    cfg: dict = {
        "train_batch_size": 2,
        "zero_optimization": {"stage": 2},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}},
    }
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    data = batches(4, 2, seed=5)

    def train(engine, steps) -> None:  # type: ignore[no-untyped-def]
        for x, y in steps:
            engine.backward(engine(x, y))
            engine.step()

    torch.manual_seed(0)
    straight, _, _, _ = initialize(model=TinyGPT(), config=cfg)
    train(straight, data)
    torch.manual_seed(0)
    first, _, _, _ = initialize(model=TinyGPT(), config=cfg)
    train(first, data[:2])
    saved = {k: v for k, v in first.strategy.state_dict().items()}
    torch.manual_seed(1)  # different initial weights: everything must come from the state
    resumed, _, _, _ = initialize(model=TinyGPT(), config=cfg)
    resumed.strategy.load_state_dict(saved)
    train(resumed, data[2:])
    for (name, a), b in zip(straight.module.named_parameters(), resumed.module.parameters()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("stage", [0, 2])
def test_prenormalized_loss_is_shown_as_the_trainer_logs_it(
    recorder: RecordingTelemetry, stage: int
) -> None:
    """The Hugging Face Trainer divides the loss by the accumulation steps itself and calls
    ``backward(loss, scale_wrt_gas=False)``; it logs the sum of those values (the mean
    micro-batch loss). The engine's step loss must be that mean too, not half of it, and equal
    to the step loss of the same run driven DeepSpeed's default way (``scale_wrt_gas=True``)."""
    cfg = {
        "train_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "zero_optimization": {"stage": stage},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.02}},
    }
    data = batches(3, 4, seed=4)
    runs = []
    for prenormalized in (True, False):
        recorder.steps.clear()
        torch.manual_seed(0)
        engine, *_ = initialize(model=TinyGPT(), config=cfg)
        means, returned = [], []
        for x, y in data:
            micro, back = [], 0.0
            for k in range(2):
                loss = engine(x[2 * k : 2 * k + 2], y[2 * k : 2 * k + 2])
                micro.append(float(loss.detach()))
                if prenormalized:
                    back += float(engine.backward(loss / 2, scale_wrt_gas=False))
                else:
                    back += float(engine.backward(loss))
                engine.step()
            means.append(sum(micro) / 2)
            returned.append(back)
        shown = [float(s.figures["loss"]) for s in recorder.steps]
        assert shown == pytest.approx(means, rel=1e-6)
        assert shown == pytest.approx(returned, rel=1e-6)  # what the Trainer sums and logs
        runs.append(shown)
    assert runs[0] == pytest.approx(runs[1], rel=1e-6)
