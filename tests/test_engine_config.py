"""ds_config reading: comments, "auto", unknown keys, unsupported keys, batch arithmetic and
DeepSpeed's defaults (zero-facts §4). No process group needed."""

from __future__ import annotations

import pytest

from zeroscope.engine.config import ConfigError, load_config


def load(raw: object, world: int = 2, **auto: object) -> object:
    return load_config(raw, dp_world_size=world, auto_values=auto)  # type: ignore[arg-type]


def test_comments_are_accepted_and_defaults_are_deepspeeds(tmp_path) -> None:
    path = tmp_path / "ds_config.json"
    path.write_text(
        """{
          // real-world ds_config files carry comments
          "train_micro_batch_size_per_gpu": 4,
          "zero_optimization": {"stage": 2}, // trailing comment
          "fp16": {"enabled": true}
        }"""
    )
    cfg = load_config(path, dp_world_size=2)
    zero = cfg.zero_optimization
    assert (zero.stage, zero.contiguous_gradients, zero.reduce_scatter) == (2, True, True)
    assert (zero.reduce_bucket_size, zero.allgather_bucket_size) == (500_000_000, 500_000_000)
    assert zero.overlap_comm is False  # DeepSpeed: True only for stage 3
    assert (zero.stage3_prefetch_bucket_size, zero.stage3_param_persistence_threshold) == (
        50_000_000,
        100_000,
    )
    assert (zero.stage3_max_live_parameters, zero.stage3_max_reuse_distance) == (10**9, 10**9)
    assert zero.sub_group_size == 10**9
    assert zero.offload_optimizer.pin_memory is True and zero.offload_optimizer.buffer_count == 4
    assert (zero.offload_param.buffer_count, zero.offload_param.buffer_size) == (5, 10**8)
    assert (cfg.aio.block_size, cfg.aio.queue_depth, cfg.aio.overlap_events) == (1048576, 8, True)
    fp16 = cfg.fp16
    assert (fp16.loss_scale, fp16.initial_scale_power, fp16.loss_scale_window) == (0, 16, 1000)
    assert (fp16.hysteresis, fp16.consecutive_hysteresis, fp16.min_loss_scale) == (2, False, 1)
    assert cfg.gradient_clipping == 1.0  # absent = DeepSpeed's GRADIENT_CLIPPING_DEFAULT
    assert (cfg.train_batch_size, cfg.gradient_accumulation_steps) == (8, 1)
    assert (
        load_config(
            {"train_batch_size": 2, "zero_optimization": {"stage": 3}}, dp_world_size=1
        ).zero_optimization.overlap_comm
        is True
    )


def test_stage3_aliases_and_integral_floats() -> None:
    cfg = load(
        {
            "train_batch_size": 8,
            "zero_optimization": {
                "stage": 3,
                "prefetch_bucket_size": 5e6,
                "stage3_gather_fp16_weights_on_model_save": True,
                "reduce_bucket_size": 2e5,
            },
        }
    )
    zero = cfg.zero_optimization  # type: ignore[attr-defined]
    assert zero.stage3_prefetch_bucket_size == 5_000_000 and isinstance(
        zero.reduce_bucket_size, int
    )
    assert zero.stage3_gather_16bit_weights_on_model_save is True


def test_auto_is_filled_from_the_caller_or_named() -> None:
    raw = {
        "train_micro_batch_size_per_gpu": "auto",
        "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
    }
    cfg = load(raw, **{"train_micro_batch_size_per_gpu": 3, "optimizer.params.lr": 0.5})
    assert cfg.train_micro_batch_size_per_gpu == 3  # type: ignore[attr-defined]
    assert cfg.optimizer.params.lr == 0.5  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r'"optimizer\.params\.lr" is "auto"'):
        load(raw, **{"train_micro_batch_size_per_gpu": 3})


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"zero_optimisation": {}},
            "unknown key zero_optimisation (did you mean 'zero_optimization'?)",
        ),
        (
            {"zero_optimization": {"reduce_bucket_sise": 1}},
            "unknown key zero_optimization.reduce_bucket_sise (did you mean 'reduce_bucket_size'?)",
        ),
        ({"fp16": {"enabeld": True}}, "unknown key fp16.enabeld (did you mean 'enabled'?)"),
        (
            {"optimizer": {"type": "AdamW", "params": {"weight_decy": 0.1}}},
            "did you mean 'weight_decay'?",
        ),
    ],
)
def test_unknown_keys_suggest_the_closest(raw: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load({"train_batch_size": 2, **raw})
    assert message in str(err.value)


def test_known_but_unsupported_keys_say_so() -> None:
    with pytest.raises(ConfigError, match=r"prescale_gradients=True: divides gradients by N"):
        load({"train_batch_size": 2, "prescale_gradients": True})
    with pytest.raises(
        ConfigError, match=r"optimizer.type 'Lamb' is not supported: DeepSpeed's own"
    ):
        load({"train_batch_size": 2, "optimizer": {"type": "Lamb"}})
    with pytest.raises(ConfigError, match=r"offload_optimizer.ratio=0.5 is not supported yet"):
        load(
            {
                "train_batch_size": 2,
                "zero_optimization": {
                    "stage": 2,
                    "offload_optimizer": {"device": "cpu", "ratio": 0.5},
                },
            }
        )
    # a number-changing key at its default, or a block switched off, is harmless
    cfg = load(
        {"train_batch_size": 2, "torch_autocast": {"enabled": False}, "prescale_gradients": 0}
    )
    assert cfg.notes.ignored == {}  # type: ignore[attr-defined]


def test_offload_param_needs_stage_3() -> None:
    with pytest.raises(ConfigError, match=r"offload_param is valid only with stage 3.*got stage 2"):
        load(
            {
                "train_batch_size": 2,
                "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}},
            }
        )


def test_batch_mismatch_names_all_four_numbers() -> None:
    with pytest.raises(ConfigError) as err:
        load(
            {
                "train_batch_size": 10,
                "train_micro_batch_size_per_gpu": 3,
                "gradient_accumulation_steps": 2,
            },
            world=2,
        )
    assert str(err.value) == (
        "train_batch_size 10 != train_micro_batch_size_per_gpu 3 x gradient_accumulation_steps 2 "
        "x data-parallel size 2 (= 12)"
    )


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2}, (16, 2, 4)),
        ({"train_batch_size": 16, "gradient_accumulation_steps": 4}, (16, 2, 4)),
        ({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4}, (16, 2, 4)),
        ({"train_batch_size": 16}, (16, 8, 1)),
        ({"train_micro_batch_size_per_gpu": 2}, (4, 2, 1)),
    ],
)
def test_two_batch_keys_give_the_third(given: dict, expected: tuple) -> None:
    cfg = load(given, world=2)
    got = (
        cfg.train_batch_size,
        cfg.train_micro_batch_size_per_gpu,
        cfg.gradient_accumulation_steps,
    )  # type: ignore[attr-defined]
    assert got == expected


def test_value_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"zero_optimization.stage must be 0, 1, 2 or 3, got 4"):
        load({"train_batch_size": 2, "zero_optimization": {"stage": 4}})
    with pytest.raises(ConfigError, match=r"fp16.hysteresis must be an integer"):
        load({"train_batch_size": 2, "fp16": {"hysteresis": "two"}})
    with pytest.raises(ConfigError, match=r"max_grad_norm is not an optimizer parameter"):
        load({"train_batch_size": 2, "optimizer": {"type": "Adam", "params": {"max_grad_norm": 1}}})
    with pytest.raises(ConfigError, match=r"fp16 and bf16 cannot both be enabled"):
        load({"train_batch_size": 2, "fp16": {"enabled": True}, "bfloat16": {"enabled": True}})
    with pytest.raises(ConfigError, match=r"not valid JSON"):
        load("{ not json")


def test_adam_type_is_adamw_style_by_default_as_in_deepspeed() -> None:
    def decoupled(opt: dict) -> bool:
        return load({"train_batch_size": 2, "optimizer": opt}).optimizer.decoupled_weight_decay  # type: ignore[attr-defined]

    assert decoupled({"type": "Adam", "params": {"weight_decay": 0.1}}) is True
    assert (
        decoupled({"type": "Adam", "params": {"weight_decay": 0.1, "adam_w_mode": False}}) is False
    )
    assert decoupled({"type": "AdamW", "params": {"adam_w_mode": False}}) is True
