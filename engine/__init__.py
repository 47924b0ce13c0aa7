"""The bundled ZeRO 0/1/2/3 training engine, configured by DeepSpeed's ds_config.json.

A DeepSpeed script ports by changing its import::

    import zeroscope.engine as deepspeed
    engine, optimizer, loader, scheduler = deepspeed.initialize(model=..., config="ds_config.json")

and ``deepspeed.comm``, ``deepspeed.zero.Init``, ``deepspeed.utils.RepeatingLoader``, ... are
DeepSpeed's public names, served by :mod:`zeroscope.engine.deepspeed` (the engine's internal
modules keep other names: ``process_group``, ``zero/stage3``, ...). ``zeroscope.engine.zero`` is
the engine's ZeRO package and, like DeepSpeed's ``deepspeed.zero`` (which is DeepSpeed's
``runtime.zero`` package), its namespace carries the public ``Init``, ``GatheredParameters``,
``register_external_parameter``.

Attributes are resolved lazily (PEP 562) so that importing the package costs nothing: the UI
side and ``zeroscope estimate`` must not pay for torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["initialize"]


def __getattr__(name: str) -> Any:
    import importlib

    if name == "zero":  # the internal package, whose namespace carries the public API too
        return importlib.import_module("zeroscope.engine.zero")
    surface = importlib.import_module("zeroscope.engine.deepspeed")
    try:
        return getattr(surface, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
