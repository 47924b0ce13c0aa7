"""zeroscope: htop for ZeRO training.

The repository keeps the card's top-level folders (engine/, agent/, zeroscope/); they install
as ``zeroscope.engine`` and ``zeroscope.agent`` so that a training folder's own ``engine.py`` or
``agent.py`` can never shadow them. When running from a source checkout without installing
(pytest from the repo root), the sibling folders are mapped here the same way.
"""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"

_here = Path(__file__).resolve().parent
for _name in ("engine", "agent"):
    _sibling = _here.parent / _name
    if not (_here / _name).is_dir() and (_sibling / "__init__.py").is_file():
        # Only these two folders are mapped: extending __path__ with the whole repo root would
        # expose tests/, bench/ ... as zeroscope subpackages.
        import importlib.util
        import sys

        _spec = importlib.util.spec_from_file_location(
            f"{__name__}.{_name}",
            _sibling / "__init__.py",
            submodule_search_locations=[str(_sibling)],
        )
        if (
            _spec is not None
            and _spec.loader is not None
            and f"{__name__}.{_name}" not in sys.modules
        ):
            _module = importlib.util.module_from_spec(_spec)
            sys.modules[f"{__name__}.{_name}"] = _module
            _spec.loader.exec_module(_module)
            globals()[_name] = _module
