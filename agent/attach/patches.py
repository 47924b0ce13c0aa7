"""Class-level replacements, recorded so they can all be put back.

The attach changes no object the user holds: it replaces methods on classes (ProcessGroup,
Work, DistributedDataParallel, DeepSpeedEngine, Trainer) and registers hooks, and it undoes
all of them when the job turns out to report through the agent API itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

_MISSING = object()
_lock = threading.Lock()
_replaced: list[tuple[Any, str, Any]] = []
_undo: list[Callable[[], Any]] = []


def replace(owner: Any, name: str, new: Any) -> Any:
    """Set ``owner.name = new`` and return what was there (the original to call)."""
    with _lock:
        original = owner.__dict__.get(name, _MISSING) if hasattr(owner, "__dict__") else _MISSING
        current = getattr(owner, name)
        _replaced.append((owner, name, original))
        setattr(owner, name, new)
        return current


def on_restore(undo: Callable[[], Any]) -> None:
    """Run ``undo`` (e.g. a hook handle's ``remove``) when everything is put back."""
    with _lock:
        _undo.append(undo)


def checkpoint() -> tuple[int, int]:
    """Where the record stands now: :func:`rollback` to it undoes what came after."""
    with _lock:
        return len(_replaced), len(_undo)


def rollback(mark: tuple[int, int]) -> None:
    """Undo the replacements and hooks made since ``mark`` (a part of the attach that failed
    half-way through its install leaves nothing behind), newest first."""
    _restore(*mark)


def restore_all() -> None:
    """Undo every replacement and hook, newest first."""
    _restore(0, 0)


def _restore(replaced: int, undo: int) -> None:
    with _lock:
        while len(_replaced) > replaced:
            owner, name, original = _replaced.pop()
            try:
                if original is _MISSING:
                    delattr(owner, name)
                else:
                    setattr(owner, name, original)
            except Exception:
                pass
        while len(_undo) > undo:
            try:
                _undo.pop()()
            except Exception:
                pass


def is_patched(owner: Any, name: str) -> bool:
    return any(o is owner and n == name for o, n, _ in _replaced)
