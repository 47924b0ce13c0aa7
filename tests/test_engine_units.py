"""Engine pieces without a process group: the loss scaler against an independent reference
written from zero-facts §5, partition math, flat Adam against torch.optim, LR schedules against
DeepSpeed's formulas."""

from __future__ import annotations

import math

import pytest
import torch

from zeroscope.engine.config_blocks import FP16Config, read_scheduler
from zeroscope.engine.lr_schedules import WarmupSchedule
from zeroscope.engine.optim import AdamHyper, AdamState, ZeroOptimizer, adam_step
from zeroscope.engine.precision import DynamicLossScaler, LossScaleAtMinimum
from zeroscope.engine.zero.partition import make_layout, padded_size, split_buckets


def reference_scale_trace(
    overflows: list[bool],
    *,
    init: float,
    window: int,
    hysteresis: int,
    consecutive: bool = False,
    min_scale: float = 1.0,
) -> tuple[list[tuple[bool, float]], int | None]:
    """(skipped, scale used) per step, and the step at which the run must stop (scale already
    at its minimum when an overflow comes), from zero-facts §5's text."""
    scale, left, last_overflow, trace = init, hysteresis, -1, []
    for it, overflow in enumerate(overflows):
        trace.append((overflow, scale))
        if overflow:
            halve = hysteresis == 1 or left == 1
            if halve and scale == min_scale:
                return trace, it
            if halve:
                scale = max(scale / 2, min_scale)
            else:
                left -= 1
            last_overflow = it
            continue
        if consecutive:
            left = hysteresis
        clean = it - last_overflow - 1
        if clean > 0 and clean % window == 0:
            if not consecutive:
                left = hysteresis
            scale *= 2
    return trace, None


def run_scaler(overflows: list[bool], **cfg: object) -> tuple[list[tuple[bool, float]], int | None]:
    scaler = DynamicLossScaler.from_config(FP16Config(enabled=True, **cfg))  # type: ignore[arg-type]
    trace = []
    for it, overflow in enumerate(overflows):
        trace.append((overflow, scaler.loss_scale))
        try:
            scaler.update(overflow)
        except LossScaleAtMinimum:
            return trace, it
    return trace, None


def test_reference_scaler_on_a_hand_worked_case() -> None:
    trace, stop = reference_scale_trace(
        [False, True, True, False, False, False, False], init=8, window=2, hysteresis=2
    )
    assert [s for _, s in trace] == [8, 8, 8, 4, 4, 4, 8] and stop is None


@pytest.mark.parametrize("consecutive", [False, True])
@pytest.mark.parametrize("hysteresis", [1, 2, 3])
def test_dynamic_scaler_matches_reference(consecutive: bool, hysteresis: int) -> None:
    g = torch.Generator().manual_seed(hysteresis + 10 * consecutive)
    overflows = (torch.rand(300, generator=g) < 0.3).tolist()
    ours = run_scaler(
        overflows,
        initial_scale_power=12,
        loss_scale_window=4,
        hysteresis=hysteresis,
        consecutive_hysteresis=consecutive,
        min_loss_scale=1.0,
    )
    ref = reference_scale_trace(
        overflows, init=2.0**12, window=4, hysteresis=hysteresis, consecutive=consecutive
    )
    assert ours == ref


def test_scaler_stops_with_a_clear_error_at_minimum() -> None:
    scaler = DynamicLossScaler.from_config(
        FP16Config(enabled=True, initial_scale_power=1, hysteresis=1, min_loss_scale=1.0)
    )
    scaler.update(True)
    assert scaler.loss_scale == 1.0
    with pytest.raises(
        LossScaleAtMinimum, match=r"already at its minimum \(1, fp16.min_loss_scale\)"
    ):
        scaler.update(True)


def test_partition_covers_every_element_once() -> None:
    numels = [7, 1, 12, 5]
    for world in (1, 2, 3, 4):
        layout = make_layout(numels, world)
        assert layout.padded_numel == padded_size(25, world) and layout.padded_numel % world == 0
        owned = [i for r in range(world) for i in range(*layout.shard_range(r))]
        assert owned == list(range(layout.padded_numel))
        for p, n in enumerate(numels):
            parts = [layout.param_in_shard(p, r) for r in range(world)]
            covered = [i for part in parts if part for i in range(*part)]
            assert covered == list(range(n))
    assert split_buckets([5, 5, 20, 1, 1], 10) == [[0, 1], [2], [3, 4]]


@pytest.mark.parametrize("decoupled", [True, False])
def test_flat_adam_equals_torch(decoupled: bool) -> None:
    torch.manual_seed(0)
    params = [torch.randn(5, 3), torch.randn(7)]
    ref = [p.clone().requires_grad_() for p in params]
    cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    opt = cls(ref, lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    flat = torch.cat([p.reshape(-1) for p in params])
    state = AdamState.zeros_like(flat)
    hp = AdamHyper(lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1, decoupled=decoupled)
    for _ in range(5):
        grads = [torch.randn_like(p) for p in params]
        for r, g in zip(ref, grads):
            r.grad = g.clone()
        opt.step()
        adam_step(flat, torch.cat([g.reshape(-1) for g in grads]), state, hp)
    expected = torch.cat([r.detach().reshape(-1) for r in ref])
    torch.testing.assert_close(flat, expected, rtol=0, atol=1e-7)


def lr_trace(kind: str, params: dict, steps: int, base_lr: float = 0.1) -> list[float]:
    opt = ZeroOptimizer(
        [{"params": [torch.zeros(1)]}],
        defaults={"lr": base_lr, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0},
        name="AdamW",
        decoupled=True,
    )
    sched = WarmupSchedule(opt, read_scheduler({"type": kind, "params": params}))
    out = [opt.param_groups[0]["lr"]]
    for _ in range(steps):
        sched.step()
        out.append(opt.param_groups[0]["lr"])
    return out


def test_warmup_lr_log_default_then_flat() -> None:
    got = lr_trace(
        "WarmupLR", {"warmup_min_lr": 0.01, "warmup_max_lr": 0.1, "warmup_num_steps": 5}, 7
    )
    # iteration -1 (before the first step) = min lr; then min + delta * log(it + 1) / log(W)
    want = [0.01] + [0.01 + 0.09 * math.log(it + 1) / math.log(5) for it in range(5)] + [0.1, 0.1]
    assert got == pytest.approx(want)
    # warmup_max_lr absent: the optimizer's lr
    assert lr_trace(
        "WarmupLR", {"warmup_num_steps": 2, "warmup_type": "linear"}, 3
    ) == pytest.approx([0.0, 0.0, 0.05, 0.1])


def test_warmup_decay_lr_linear() -> None:
    got = lr_trace(
        "WarmupDecayLR",
        {
            "total_num_steps": 10,
            "warmup_max_lr": 0.1,
            "warmup_num_steps": 4,
            "warmup_type": "linear",
        },
        12,
    )
    want = (
        [0.0]
        + [0.1 * it / 4 for it in range(4)]
        + [0.1 * max(0.0, (10 - it) / 6) for it in range(4, 12)]
    )
    assert got == pytest.approx(want)


def test_warmup_cosine_lr() -> None:
    got = lr_trace(
        "WarmupCosineLR",
        {
            "total_num_steps": 10,
            "warmup_num_steps": 4,
            "warmup_min_ratio": 0.1,
            "cos_min_ratio": 0.01,
        },
        12,
    )
    want = [0.0]
    for it in range(12):
        if it < 4:
            ratio = 0.1 + 0.9 * math.log(it + 1) / math.log(4)
        else:
            progress = min(1.0, (it - 4 + 1) / 6)
            ratio = 0.01 + 0.99 * (1 + math.cos(math.pi * progress)) / 2
        want.append(0.1 * ratio)
    assert got == pytest.approx(want)
