"""DeepSpeed's public module surface over the bundled engine: what ``import deepspeed`` gives a
script, mirrored name for name for the parts DeepSpeed scripts and the Hugging Face /
accelerate integration use.

Two ways in: ``import zeroscope.engine as deepspeed`` (the engine package forwards these names),
or ``zeroscope run --as-deepspeed train.py``, which maps ``deepspeed`` and ``deepspeed.*`` to
this package and its submodules (``alias.py``), so an unchanged ``import deepspeed`` or
``from deepspeed.runtime.lr_schedules import VALID_LR_SCHEDULES`` runs on the engine.

Layout mirrors DeepSpeed's: ``comm``, ``zero`` (= ``runtime.zero``, as in DeepSpeed),
``runtime.lr_schedules``, ``runtime.engine``, ``runtime.zero.partition_parameters``,
``utils``, ``checkpoint.utils``, ``accelerator``, ``checkpointing`` (activation checkpointing).
``pipe`` (pipeline parallelism) has its place here and is built elsewhere. docs/engine.md lists
every name with its status (``python -m zeroscope.engine.keys --markdown``).

Attributes resolve lazily (PEP 562): importing the package costs nothing until a name is used.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.19.8+zeroscope"
"""The DeepSpeed release whose API and config semantics this surface follows, marked as ours."""
__git_hash__ = "zeroscope"
__git_branch__ = "zeroscope"

_FUNCTIONS = {
    "initialize": "zeroscope.engine.api",
    "add_config_arguments": "zeroscope.engine.api",
    "init_distributed": "zeroscope.engine.api",
    "DeepSpeedEngine": "zeroscope.engine.deepspeed.runtime.engine",
    "DeepSpeedConfigError": "zeroscope.engine.config",
    "log_dist": "zeroscope.engine.deepspeed.utils",
    "logger": "zeroscope.engine.deepspeed.utils",
}
_MODULES = {
    "comm": "zeroscope.engine.deepspeed.comm",
    "zero": "zeroscope.engine.deepspeed.runtime.zero",
    "runtime": "zeroscope.engine.deepspeed.runtime",
    "utils": "zeroscope.engine.deepspeed.utils",
    "checkpoint": "zeroscope.engine.deepspeed.checkpoint",
    "accelerator": "zeroscope.engine.deepspeed.accelerator",
    "ops": "zeroscope.engine.deepspeed.ops",
    "checkpointing": "zeroscope.engine.checkpointing",
}
_RENAMED = {"DeepSpeedConfigError": "ConfigError"}

__all__ = sorted([*_FUNCTIONS, *_MODULES, "__version__"])


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    if name in _FUNCTIONS:
        module = importlib.import_module(_FUNCTIONS[name])
        return getattr(module, _RENAMED.get(name, name))
    raise AttributeError(f"module 'deepspeed' (zeroscope's engine) has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
