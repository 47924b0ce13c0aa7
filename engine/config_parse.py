"""The generic reader behind every ds_config block: raw dict -> typed dataclass.

Each block is a ``@dataclass(kw_only=True, slots=True)`` whose field names are DeepSpeed's key
names and whose defaults are DeepSpeed's defaults. :func:`read_block` walks the raw dict once and
turns every mistake into a one-line :class:`ConfigError` naming the dotted key:

- an unknown key names the closest known key (``difflib``), because a typo that DeepSpeed's
  pydantic models would reject (or, for some blocks, silently drop) should cost one glance;
- a key DeepSpeed knows but this engine does not implement yet is rejected *as such* (never
  silently ignored), unless it carries its harmless default or is a block with
  ``"enabled": false``;
- ``"auto"`` must have been filled before (see :func:`fill_auto`): DeepSpeed drops it silently
  inside blocks and crashes with a TypeError at the top level; we name the key instead.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin

T = TypeVar("T")

REJECT_ANY: Any = object()
"""Marker in a block's ``UNSUPPORTED`` table: every value of that key is rejected."""


class ConfigError(ValueError):
    """A ds_config problem; ``str()`` is one line that names the key."""


def suggest(key: str, known: list[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest known key, or nothing."""
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def fill_auto(raw: Any, values: Mapping[str, Any], path: str = "") -> Any:
    """A copy of ``raw`` with every ``"auto"`` replaced by ``values[dotted.key]``.

    ``"auto"`` means "filled in by the caller" (the Hugging Face Trainer fills them from its own
    arguments); a key the caller did not fill is an error naming it."""
    if isinstance(raw, Mapping):
        return {k: fill_auto(v, values, f"{path}.{k}" if path else str(k)) for k, v in raw.items()}
    if isinstance(raw, list):
        return [fill_auto(v, values, f"{path}[{i}]") for i, v in enumerate(raw)]
    if isinstance(raw, str) and raw == "auto":
        if path not in values:
            raise ConfigError(
                f'"{path}" is "auto" but no value was given for it: pass '
                f"auto_values={{'{path}': ...}} to initialize() or write the value in the config"
            )
        return values[path]
    return raw


def _is_off(value: Any, default: Any) -> bool:
    if default is not REJECT_ANY and value == default:
        return True
    return isinstance(value, Mapping) and value.get("enabled") is False


def _coerce(value: Any, hint: Any, path: str) -> Any:
    """Check ``value`` against the field's type hint; JSON writes 5e8 for ints, so integral
    floats become ints."""
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        options = get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, path)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{path}: unexpected value {value!r}")
    if origin is Literal:
        choices = get_args(hint)
        if value not in choices:
            raise ConfigError(f"{path} must be one of {list(choices)}, got {value!r}")
        return value
    if origin in (tuple, list):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{path} must be a list, got {value!r}")
        args = get_args(hint)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise ConfigError(f"{path} must have {len(args)} items, got {value!r}")
            return tuple(_coerce(v, a, f"{path}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
        inner = args[0] if args else Any
        return origin(_coerce(v, inner, f"{path}[{i}]") for i, v in enumerate(value))
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path} must be an object {{...}}, got {value!r}")
        return read_block(hint, value, path)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{path} must be an integer, got {value!r}")
        if isinstance(value, float) and not value.is_integer():
            raise ConfigError(f"{path} must be an integer, got {value!r}")
        return int(value)
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{path} must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path} must be a string, got {value!r}")
        return value
    if hint is Any or hint is object:
        return value
    if isinstance(hint, type) and issubclass(hint, dict):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path} must be an object {{...}}, got {value!r}")
        return dict(value)
    raise AssertionError(f"no reader for type {hint!r} at {path}")  # internal: a field type typo


def read_block(cls: type[T], raw: Mapping[str, Any], path: str = "") -> T:
    """Build ``cls`` from ``raw``; see the module docstring for the rules.

    A block class may declare ``ALIASES: ClassVar[dict[str, str]]`` (DeepSpeed's alternative
    spellings, e.g. ``stage3_prefetch_bucket_size`` -> ``prefetch_bucket_size``) and
    ``UNSUPPORTED: ClassVar[dict[str, Any]]`` (key -> the value that is harmless, or
    :data:`REJECT_ANY`)."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    aliases: dict[str, str] = getattr(cls, "ALIASES", {})
    unsupported: dict[str, Any] = getattr(cls, "UNSUPPORTED", {})
    prefix = f"{path}." if path else ""
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        name = aliases.get(key, key)
        where = f"{prefix}{key}"
        if name in names:
            if name in kwargs:
                raise ConfigError(f"{where} is given twice (once under another DeepSpeed alias)")
            kwargs[name] = _coerce(value, hints[name], where)
        elif key in unsupported:
            if not _is_off(value, unsupported[key]):
                raise ConfigError(
                    f"{where} is a DeepSpeed key that zeroscope's engine does not support yet "
                    f"(remove it, or set it to its default)"
                )
        else:
            known = sorted({*names, *aliases, *unsupported})
            raise ConfigError(f"unknown key {where}{suggest(str(key), known)}")
    try:
        block = cls(**kwargs)
    except ConfigError:
        raise
    except ValueError as exc:  # __post_init__ checks raise ValueError naming the field
        raise ConfigError(f"{prefix}{exc}") from None
    return block


class Block:
    """Mixin for block dataclasses: the two optional tables read by :func:`read_block`."""

    __slots__ = ()

    ALIASES: ClassVar[dict[str, str]] = {}
    UNSUPPORTED: ClassVar[dict[str, Any]] = {}
