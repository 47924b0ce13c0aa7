"""ds_config semantics against DeepSpeed 0.19.8 itself (tier 1, no process group).

The oracle is DeepSpeed's own config reader: every key it looks up (recorded by handing its
``DeepSpeedConfig`` a dict that logs each lookup) and every field and alias of its pydantic
blocks must be classified by the engine (engine/keys.py); its pydantic lax conversions must be
accepted with the same values; configs it accepts must load here. docs/engine.md must hold the
generated tables.
"""

from __future__ import annotations

import logging
import math
import os
import typing
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import pydantic
from deepspeed.runtime.config import DeepSpeedConfig as DSConfig
from deepspeed.runtime.config_utils import DeepSpeedConfigModel

from zeroscope.engine import keys
from zeroscope.engine.config import ConfigError, load_config
from zeroscope.engine.config_parse import convert

ROOT = Path(__file__).resolve().parent.parent
BATCH = {"train_micro_batch_size_per_gpu": 1}


class _Recorder(dict):
    """A dict that logs every key looked up (``get``, ``[]``, ``in``, ``in keys()``)."""

    def __init__(self, *args: Any, path: str = "", log: set[str] | None = None) -> None:
        super().__init__(*args)
        self.path, self.log = path, log if log is not None else set()

    def _note(self, key: Any) -> None:
        if isinstance(key, str):
            self.log.add(self.path + key)

    def get(self, key: Any, default: Any = None) -> Any:
        self._note(key)
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self._note(key)
        return super().__getitem__(key)

    def __contains__(self, key: Any) -> bool:
        self._note(key)
        return super().__contains__(key)

    def keys(self) -> Any:
        outer = self

        class Keys:
            def __contains__(self, key: Any) -> bool:
                outer._note(key)
                return dict.__contains__(outer, key)

            def __iter__(self) -> Any:
                return iter(dict.keys(outer))

            def __len__(self) -> int:
                return dict.__len__(outer)

        return Keys()

    def __copy__(self) -> _Recorder:
        return _Recorder(self, path=self.path, log=self.log)


def _looked_up(raw: dict[str, Any]) -> set[str]:
    log: set[str] = set()
    logging.disable(logging.WARNING)
    try:
        DSConfig(_Recorder(raw, log=log))
    except Exception:
        pass  # a block that is not a dict: what it looked up before failing still counts
    finally:
        logging.disable(logging.NOTSET)
    return log


def deepspeed_keys() -> set[str]:
    """Every top-level key DeepSpeed's config reader looks up, and the keys it looks up inside
    each block handed to it as an (empty) dict."""
    top = _looked_up(dict(BATCH))
    found = set(top)
    for key in sorted(top - set(BATCH)):
        log: set[str] = set()
        sub = _Recorder(path=key + ".", log=log)
        try:
            logging.disable(logging.WARNING)
            DSConfig(_Recorder({**BATCH, key: sub}))
        except Exception:
            pass
        finally:
            logging.disable(logging.NOTSET)
        found |= log
    return found


def pydantic_keys(model: type[DeepSpeedConfigModel], prefix: str) -> set[str]:
    """Field names and aliases of a DeepSpeed pydantic block, nested blocks included."""
    out = set()
    for name, field in model.model_fields.items():
        out.add(prefix + name)
        if field.alias:
            out.add(prefix + field.alias)
        for arg in (field.annotation, *typing.get_args(field.annotation)):
            if isinstance(arg, type) and issubclass(arg, DeepSpeedConfigModel):
                out |= pydantic_keys(arg, f"{prefix}{name}.")
    return out


def _classified(name: str, rows: dict[str, str]) -> bool:
    """``name`` or a block above it that is ignored or refused as a whole has a row."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        status = rows.get(".".join(parts[:i]))
        if status is not None:
            return i == len(parts) or status != keys.IMPLEMENTED
    return False


def test_every_key_deepspeed_reads_is_classified() -> None:
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    rows = {r.name: r.status for r in keys.config_rows()}
    wanted = deepspeed_keys()
    wanted |= pydantic_keys(DeepSpeedFP16Config, "fp16.")
    wanted |= pydantic_keys(DeepSpeedBF16Config, "bf16.")
    wanted |= pydantic_keys(DeepSpeedZeroConfig, "zero_optimization.")
    assert len(wanted) > 150  # the recorder really saw DeepSpeed's reader
    missing = sorted(k for k in wanted if not _classified(k, rows))
    assert missing == []


def test_every_deepspeed_engine_member_is_listed() -> None:
    import torch
    from deepspeed.runtime.engine import DeepSpeedEngine

    theirs = {n for n in dir(DeepSpeedEngine) if not n.startswith("_")} - set(dir(torch.nn.Module))
    listed = set(keys.engine_members()) | set(keys.ENGINE_DIFFERENT)
    listed |= {n for names in keys.ENGINE_NOT_BUILT.values() for n in names}
    assert sorted(theirs - listed) == []
    # what the Hugging Face integration calls is implemented, not only listed
    used = {
        "backward", "step", "zero_grad", "set_gradient_accumulation_boundary",
        "is_gradient_accumulation_boundary", "get_global_grad_norm", "get_lr", "was_step_applied",
        "zero_gather_16bit_weights_on_model_save", "save_checkpoint", "load_checkpoint",
        "save_16bit_model", "train_batch_size", "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps", "zero_optimization_stage", "bfloat16_enabled",
        "fp16_enabled", "global_steps", "global_samples", "skipped_steps", "local_rank", "device",
        "module", "config", "optimizer", "lr_scheduler",
    }  # fmt: skip
    assert used <= set(keys.engine_members())


def test_what_transformers_and_accelerate_import_exists() -> None:
    """Names the installed transformers / accelerate sources take from ``deepspeed`` (found by
    scanning them) resolve on the surface, unless they are listed as not built."""
    import re

    import accelerate
    import transformers

    import zeroscope.engine.deepspeed as surface

    pattern = re.compile(r"deepspeed\.((?:zero|comm|runtime\.lr_schedules|checkpoint\.utils)\.\w+)")
    used = set()
    for package in (transformers, accelerate):
        for path in Path(package.__path__[0]).rglob("*.py"):
            used |= set(pattern.findall(path.read_text(errors="ignore")))
    assert {"zero.GatheredParameters", "zero.Init", "comm.get_rank"} <= used
    for dotted in sorted(used):
        value: Any = surface
        for part in dotted.split("."):
            value = getattr(value, part)


# -- conversions: DeepSpeed's pydantic lax mode --------------------------------------------------

LAX_INPUTS = [0, 1, 2, -1, True, False, "true", "True", "yes", "on", "off", "no", "t", "f",
              "1", "0", 1.0, 0.0, 1.5, 5e8, "5", "5.0", " 5", "1e-3", math.inf, None, "auto"]  # fmt: skip


@pytest.mark.parametrize("hint", [bool, int, float, int | None, float | None])
def test_pydantic_lax_values_are_accepted_with_the_same_meaning(hint: Any) -> None:
    adapter = pydantic.TypeAdapter(hint)
    for value in LAX_INPUTS:
        try:
            expected = adapter.validate_python(value)
        except pydantic.ValidationError:
            continue  # pydantic refuses it: we may refuse it too, or be more lenient
        assert convert(value, hint, "k") == expected, (hint, value)


def _load(raw: dict[str, Any], world: int = 1) -> Any:
    return load_config(raw, dp_world_size=world)


def test_issue_13_configs_deepspeed_accepts_load() -> None:
    """The configs a user would write, first checked against DeepSpeed itself."""
    raw = {
        "train_batch_size": 8,
        "gradient_accumulation_steps": 2,
        "steps_per_print": math.inf,  # accelerate writes float("inf")
        "zero_optimization": {
            "stage": 2,
            "overlap_comm": 1,
            "contiguous_gradients": "true",
            "round_robin_gradients": True,
            "reduce_bucket_size": 5e8,
            "allgather_bucket_size": "auto",
        },
        "fp16": {"enabled": "auto", "loss_scale_window": 100.0},
        "bf16": {"enabled": 0},
        "tensorboard": {"enabled": True, "output_path": "tb", "job_name": "x"},
        "wandb": {"enabled": False},
        "csv_monitor": {"enabled": True, "output_path": "csv"},
        "flops_profiler": {"enabled": True, "profile_step": 2},
        "comms_logger": {"enabled": True, "verbose": False},
        "aio": {"block_size": 1048576, "queue_depth": 16},
        "data_efficiency": {"enabled": False},
        "autotuning": {"enabled": False},
        "wall_clock_breakdown": True,
    }
    logging.disable(logging.WARNING)
    try:
        ds = DSConfig(dict(raw))
    finally:
        logging.disable(logging.NOTSET)
    cfg = _load(raw)  # DeepSpeed read it as world size 1 (no process group)
    assert cfg.zero_optimization.overlap is True and ds.zero_config.overlap_comm is True
    assert cfg.zero_optimization.contiguous_gradients is True
    assert cfg.zero_optimization.reduce_bucket_size == ds.zero_config.reduce_bucket_size
    assert cfg.zero_optimization.allgather_bucket_size == ds.zero_config.allgather_bucket_size
    assert cfg.fp16.enabled is False and cfg.bf16.enabled is False
    assert cfg.fp16.loss_scale_window == 100
    assert cfg.steps_per_print == math.inf
    assert (cfg.train_batch_size, cfg.micro_batch, cfg.accumulation_steps) == (
        ds.train_batch_size,
        ds.train_micro_batch_size_per_gpu,
        ds.gradient_accumulation_steps,
    )
    ignored = set(cfg.notes.ignored)
    assert {
        "tensorboard", "csv_monitor", "flops_profiler", "comms_logger", "aio.queue_depth",
        "zero_optimization.round_robin_gradients", "wall_clock_breakdown",
        "zero_optimization.allgather_bucket_size", "fp16.enabled",
    } == ignored  # fmt: skip
    assert "wandb" not in ignored  # switched off: nothing to say
    quiet = _load({**BATCH, "wall_clock_breakdown": False, "memory_breakdown": 0, "timers": {}})
    assert quiet.notes.ignored == {}


def test_ignored_keys_are_reported_once_per_process(caplog: pytest.LogCaptureFixture) -> None:
    from zeroscope.engine import config as config_module

    config_module._reported.discard("tensorboard")
    raw = {"train_batch_size": 2, "tensorboard": {"enabled": True}}
    with caplog.at_level(logging.WARNING, logger="zeroscope.engine"):
        first = config_module.report_ignored(_load(raw), rank=0)
        second = config_module.report_ignored(_load(raw), rank=0)
    assert first == [
        "ds_config tensorboard: accepted and ignored (DeepSpeed's metric writer; zeroscope "
        "records loss, lr, grad norm, loss scale and memory every step itself)"
    ]
    assert second == []
    assert [r.getMessage() for r in caplog.records] == first


def test_number_changing_keys_are_refused_but_not_when_off() -> None:
    with pytest.raises(ConfigError, match=r"^prescale_gradients='yes': divides gradients"):
        _load({**BATCH, "prescale_gradients": "yes"})
    with pytest.raises(ConfigError, match=r"^torch_autocast=\{\.\.\.\}: autocast changes"):
        _load({**BATCH, "torch_autocast": {"enabled": True}})
    with pytest.raises(ConfigError, match=r"^elasticity=\{\.\.\.\}: elastic training was removed"):
        _load({**BATCH, "elasticity": {"enabled": True}})
    cfg = _load(
        {
            **BATCH,
            "prescale_gradients": 0,
            "torch_autocast": {"enabled": "false"},
            "elasticity": {"enabled": False},
            "compression_training": {},
            "zero_optimization": {"zero_quantized_weights": False, "mics_shard_size": -1},
        }
    )
    assert cfg.notes.ignored == {}


def test_deprecated_zero_keys_mean_what_deepspeed_makes_of_them() -> None:
    raw = {**BATCH, "zero_optimization": {"stage": 3, "cpu_offload": True, "cpu_offload_param": 1}}
    logging.disable(logging.WARNING)
    try:
        ds = DSConfig(dict(raw)).zero_config
    finally:
        logging.disable(logging.NOTSET)
    zero = _load(raw).zero_optimization
    assert zero.offload_optimizer.device == ds.offload_optimizer.device == "cpu"
    assert zero.offload_param.device == ds.offload_param.device == "cpu"
    with pytest.raises(ConfigError, match="same setting; give one"):
        _load({**BATCH, "zero_optimization": {"cpu_offload": True, "offload_optimizer": {}}})


def test_unfilled_auto_is_the_default_inside_pydantic_blocks_only() -> None:
    cfg = _load({**BATCH, "zero_optimization": {"reduce_bucket_size": "auto"}})
    assert cfg.zero_optimization.reduce_bucket_size == 500_000_000
    with pytest.raises(ConfigError, match='"gradient_clipping" is "auto"'):
        _load({**BATCH, "gradient_clipping": "auto"})


# -- the generated documentation ------------------------------------------------------------------


def test_docs_hold_the_generated_tables() -> None:
    text = (ROOT / "docs" / "engine.md").read_text()
    assert keys.BEGIN in text and keys.END in text, "docs/engine.md lost its generated section"
    section = text.split(keys.BEGIN, 1)[1].split(keys.END, 1)[0]
    assert section.strip() == keys.markdown().strip(), (
        "docs/engine.md is stale: `python -m zeroscope.engine.keys --update docs/engine.md`"
    )


def test_unset_weight_decay_is_the_default_of_the_optimizer_deepspeed_builds() -> None:
    """Bug fixed: ``torch_adam`` was taken as "same math", but DeepSpeed then builds
    torch.optim.AdamW, whose weight_decay default (0.01) is not FusedAdam's (0); found by the
    differential test (tests/test_deepspeed_dropin.py)."""
    import inspect

    import torch
    from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam

    def default(cls: type) -> float:
        return float(inspect.signature(cls).parameters["weight_decay"].default)

    def ours(**params: Any) -> float:
        opt = {"type": params.pop("type"), "params": params}
        return float(_load({**BATCH, "optimizer": opt}).optimizer.params.weight_decay)

    assert ours(type="AdamW", torch_adam=True) == default(torch.optim.AdamW) == 0.01
    assert ours(type="Adam", torch_adam=True) == default(torch.optim.AdamW)  # adam_w_mode
    assert ours(type="Adam", torch_adam=True, adam_w_mode=False) == default(torch.optim.Adam)
    assert ours(type="AdamW") == default(FusedAdam) == default(DeepSpeedCPUAdam) == 0.0
    assert ours(type="AdamW", torch_adam=True, weight_decay=0.3) == 0.3
