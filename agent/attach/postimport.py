"""Post-import hooks: run a function once a module has *finished* importing.

The attach installs its wrappers when ``torch.distributed`` (or ``deepspeed``, or
``transformers.trainer``) is ready. A hook that fires while the module is still executing, or
while a parent package is still half-initialized (``import torch`` imports
``torch.distributed`` from inside ``torch/__init__.py``), sees half-built modules and breaks
the import. So a hook fires only when its module's ``exec_module`` has returned *and* no
ancestor package is still initializing; otherwise it waits for the outermost initializing
ancestor to finish.

Mechanism: a ``sys.meta_path`` finder that, for watched names only, asks the rest of
``meta_path`` for the real spec and wraps its loader's ``exec_module`` (the same shape as
wrapt's post-import hooks, PEP 369's withdrawn proposal). Modules already imported fire at
once. Nothing here imports torch.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

Hook = Callable[[ModuleType], None]

_lock = threading.RLock()
_hooks: dict[str, list[Hook]] = {}
_deferred: dict[str, list[tuple[str, Hook]]] = {}
"""Ancestor name -> (module name, hook) that wait for that ancestor to finish importing."""
_errors: list[str] = []


def _initializing(name: str) -> bool:
    module = sys.modules.get(name)
    if module is None:
        return True
    spec = getattr(module, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def _busy_ancestor(name: str) -> str | None:
    """The outermost ancestor package of ``name`` still executing, if any."""
    parts = name.split(".")
    for i in range(1, len(parts)):
        parent = ".".join(parts[:i])
        if parent in sys.modules and _initializing(parent):
            return parent
    return None


def _run(name: str, hook: Hook) -> None:
    try:
        hook(sys.modules[name])
    except Exception as exc:  # a hook must never break the user's import
        _errors.append(f"{name}: {exc!r}")
        print(f"zeroscope: attach hook for {name} failed ({exc!r})", file=sys.stderr)


def _fire(name: str) -> None:
    """``name`` finished executing: run its hooks now, or when its busy ancestor finishes;
    then run the hooks that were waiting for ``name`` itself."""
    with _lock:
        hooks = _hooks.pop(name, [])
        waiting = _deferred.pop(name, [])
        ancestor = _busy_ancestor(name)
        if ancestor is not None and hooks:
            _deferred.setdefault(ancestor, []).extend((name, h) for h in hooks)
            hooks = []
    for hook in hooks:
        _run(name, hook)
    while waiting:  # a hook run here may register more for ``name``'s submodules, deferred
        for waiting_name, hook in waiting:  # to ``name`` while its import is still closing
            if waiting_name in sys.modules:
                _run(waiting_name, hook)
        with _lock:
            waiting = _deferred.pop(name, [])


def when_imported(name: str, hook: Hook) -> None:
    """Call ``hook(module)`` once ``name`` is fully imported (now, if it already is).

    ``name`` and its ancestor packages are watched from now on, so a hook for a submodule
    imported by its parent's ``__init__`` waits for the parent to finish."""
    with _lock:
        ancestor = _busy_ancestor(name)
        ready = name in sys.modules and not _initializing(name) and ancestor is None
        if name in sys.modules and not _initializing(name) and ancestor is not None:
            # Imported already, by an ancestor still executing (``import torch`` imports
            # ``torch.distributed.device_mesh`` on its way): no load of it will come, so the
            # hook runs when that ancestor finishes (see _fire).
            _deferred.setdefault(ancestor, []).append((name, hook))
        elif not ready:
            if name in sys.modules and ancestor is None:
                # Mid-import right now, and not through our loader: nothing will tell us when
                # it ends. Never happens from the bootstrap (it runs before any import).
                print(f"zeroscope: {name} is being imported; attach skipped", file=sys.stderr)
                return
            _hooks.setdefault(name, []).append(hook)
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                _finder.watch(".".join(parts[:i]))
    if ready:
        _run(name, hook)
    _ensure_installed()


class _Loader(importlib.abc.Loader):
    """Delegates to the real loader and fires hooks once ``exec_module`` has returned."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        # Put the real loader back first: importlib.resources and friends look at __loader__.
        spec = module.__spec__
        if spec is not None:
            spec.loader = self._loader
        module.__loader__ = self._loader
        self._loader.exec_module(module)
        _fire(module.__name__)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._loader, attr)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self._watched: set[str] = set()
        self._local = threading.local()

    def watch(self, name: str) -> None:
        self._watched.add(name)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self._watched:
            return None
        busy: set[str] = self._local.__dict__.setdefault("busy", set())
        if fullname in busy:
            return None
        busy.add(fullname)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            busy.discard(fullname)
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader)
        return spec


_finder = _Finder()


def _ensure_installed() -> None:
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def errors() -> list[str]:
    """Hooks that raised (each also printed once to stderr)."""
    return list(_errors)
