"""``deepspeed`` as an alias of the engine's DeepSpeed surface, for ``zeroscope run
--as-deepspeed``: an unchanged ``import deepspeed`` / ``from deepspeed.x import y`` gets
:mod:`zeroscope.engine.deepspeed` and its submodules.

A meta-path finder placed first on ``sys.meta_path`` answers for ``deepspeed`` and every
``deepspeed.*`` name, whether or not the real package is installed, by importing the
``zeroscope.engine.deepspeed.*`` module of the same path and handing back that very module
object: one module, two names, so state (a ``zero.Init`` context, the logger) is never split.
A name the surface does not have is a plain ``ModuleNotFoundError`` naming it.

It also answers ``importlib.metadata`` lookups for the ``deepspeed`` distribution, because
accelerate and transformers decide that DeepSpeed is installed (and which version) from the
package metadata, not from the import.

Installed by :func:`install` (the run's bootstrap, ``boot/sitecustomize.py``, calls
:func:`install_from_env`, active when ``ZEROSCOPE_AS_DEEPSPEED=1``); :func:`uninstall` removes
it. Nothing here imports the engine until a ``deepspeed`` import asks for it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

ENV = "ZEROSCOPE_AS_DEEPSPEED"
"""Set to 1 in a process's environment to alias ``deepspeed`` there (see boot/)."""
ALIAS = "deepspeed"
TARGET = "zeroscope.engine.deepspeed"
VERSION = "0.19.8+zeroscope"
"""The DeepSpeed release whose API and config semantics the surface follows, marked as ours."""


def _target(fullname: str) -> str | None:
    if fullname == ALIAS:
        return TARGET
    if fullname.startswith(ALIAS + "."):
        return TARGET + fullname[len(ALIAS) :]
    return None


class _ExistingModule(importlib.abc.Loader):
    """Loads a name as an already-imported module object (no second copy)."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module
        self.own_spec = module.__spec__

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return self.module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run (the module was executed under its own name); the import system has
        just set ``__spec__`` to the alias's spec, so put the module's own spec back."""
        module.__spec__ = self.own_spec


class _Distribution(importlib.metadata.Distribution):
    """The ``deepspeed`` distribution's metadata, as the aliased surface presents it."""

    def read_text(self, filename: str) -> str | None:
        if filename == "METADATA":
            return (
                "Metadata-Version: 2.1\n"
                f"Name: {ALIAS}\n"
                f"Version: {VERSION}\n"
                "Summary: zeroscope's bundled engine under DeepSpeed's name (--as-deepspeed)\n"
            )
        return None

    def locate_file(self, path: str | os.PathLike[str]) -> Path:
        return Path(__file__).parent / path


class DeepSpeedAlias(importlib.abc.MetaPathFinder):
    """The finder (see the module docstring)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        name = _target(fullname)
        if name is None:
            return None
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # the surface has no such module: say it with the user's name
                return None
            raise
        return importlib.machinery.ModuleSpec(
            fullname,
            _ExistingModule(module),
            is_package=hasattr(module, "__path__"),
        )

    def find_distributions(self, context: Any = None) -> Iterable[importlib.metadata.Distribution]:
        name = getattr(context, "name", None)
        if name is None or name.replace("_", "-").lower() == ALIAS:
            return [_Distribution()]
        return []


_finder: DeepSpeedAlias | None = None


def install() -> None:
    """Alias ``deepspeed`` in this process from now on (a no-op when already done). A real
    ``deepspeed`` imported before stays in ``sys.modules`` under its name: install first."""
    global _finder
    if _finder is None:
        _finder = DeepSpeedAlias()
        sys.meta_path.insert(0, _finder)


def uninstall() -> None:
    """Remove the alias and forget the ``deepspeed`` modules imported through it."""
    global _finder
    if _finder is not None:
        sys.meta_path.remove(_finder)
        _finder = None
    for name in [n for n in sys.modules if n == ALIAS or n.startswith(ALIAS + ".")]:
        if getattr(sys.modules[name], "__name__", "").startswith(TARGET):
            del sys.modules[name]


def install_from_env() -> bool:
    """Install when ``ZEROSCOPE_AS_DEEPSPEED=1``; returns whether it did."""
    if os.environ.get(ENV) == "1":
        install()
        return True
    return False
