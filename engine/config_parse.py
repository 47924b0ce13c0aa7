"""The generic reader behind every ds_config block: raw dict -> typed dataclass.

Each block is a ``@dataclass(kw_only=True, slots=True)`` whose field names are DeepSpeed's key
names and whose defaults are DeepSpeed's defaults. Every other key DeepSpeed 0.19.8 knows is
listed in the block's ``KEYS`` table with what this engine does with it:

- :class:`Ignored` — accepted and reported once, with the reason: it only tunes DeepSpeed's
  own speed, memory or logging (``tensorboard``, ``round_robin_gradients``, ...);
- :class:`Refused` — it would change the numbers (or names a feature DeepSpeed 0.19.8 removed),
  so it is an error, unless it carries a value that changes nothing (DeepSpeed's default, or a
  block switched off with ``"enabled": false``);
- :class:`Deprecated` — DeepSpeed's old spelling whose value is rewritten onto the new key.

Values are converted the way DeepSpeed's pydantic models do it (lax mode): ``0``/``1`` and
``"true"``/``"yes"``/``"on"`` for booleans, integral floats such as ``5e8`` for integers,
numbers for floats. :func:`convert` does it with ``msgspec.convert(strict=False)`` plus the few
spellings pydantic accepts and msgspec does not.

``"auto"`` (the Hugging Face integration's "fill me in") is filled from the caller's values by
:func:`fill_auto`; one left unfilled means DeepSpeed's default inside a block DeepSpeed validates
with pydantic (its ``DeepSpeedConfigModel`` drops "auto") and is an error elsewhere, naming the
key (DeepSpeed keeps the string and fails later).

Unknown keys are errors naming the closest known key (``difflib``): DeepSpeed's pydantic blocks
refuse them too, and its top level silently drops them, which hides typos.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import msgspec

T = TypeVar("T")

AUTO = "auto"


class ConfigError(ValueError):
    """A ds_config problem; ``str()`` is one line that names the key."""


@dataclass(frozen=True, slots=True)
class Ignored:
    """Accepted with no effect; reported once with ``reason`` (unless the value is off)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Refused:
    """An error with ``reason`` unless the value is one of ``harmless``, off, or passes
    ``harmless_if``."""

    reason: str
    harmless: tuple[Any, ...] = ()
    harmless_if: Callable[[Any], bool] | None = None

    def accepts(self, value: Any) -> bool:
        return is_off(value, self.harmless) or bool(self.harmless_if and self.harmless_if(value))


@dataclass(frozen=True, slots=True)
class Deprecated:
    """DeepSpeed's old key: its value becomes ``{new_key: rewrite(value)}`` (nothing when
    ``rewrite`` returns None)."""

    new_key: str
    rewrite: Callable[[Any], Any] = lambda value: value


KeyStatus = Ignored | Refused | Deprecated


@dataclass(slots=True)
class Notes:
    """What reading a config found worth saying once: ignored keys and defaulted "auto"s."""

    ignored: dict[str, str] = dataclasses.field(default_factory=dict)
    """dotted key -> why it has no effect here."""


def suggest(key: str, known: list[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest known key, or nothing."""
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def fill_auto(raw: Any, values: Mapping[str, Any], path: str = "") -> Any:
    """A copy of ``raw`` with every ``"auto"`` that ``values`` has a dotted key for replaced
    (the Hugging Face Trainer fills them from its own arguments); the rest stay ``"auto"``."""
    if isinstance(raw, Mapping):
        return {k: fill_auto(v, values, f"{path}.{k}" if path else str(k)) for k, v in raw.items()}
    if isinstance(raw, list):
        return [fill_auto(v, values, f"{path}[{i}]") for i, v in enumerate(raw)]
    if isinstance(raw, str) and raw == AUTO and path in values:
        return values[path]
    return raw


def is_off(value: Any, harmless: tuple[Any, ...] = ()) -> bool:
    """True for a value that changes nothing: a harmless value, None, an empty block or a block
    with ``"enabled"`` false (0 and "false" count, as pydantic reads them)."""
    if value is None or any(_same(value, h) for h in harmless):
        return True
    if isinstance(value, Mapping):
        if not value:
            return True
        if "enabled" in value:
            try:
                return not convert(value["enabled"], bool, "enabled")
            except ConfigError:
                return False
    return False


def _same(value: Any, harmless: Any) -> bool:
    """``value`` read as the harmless value's type equals it (``0`` is ``false``)."""
    if harmless is None:
        return value is None
    try:
        return bool(convert(value, type(harmless), "") == harmless)
    except ConfigError:
        return False


_BOOL_WORDS = {
    "true": True, "t": True, "yes": True, "y": True, "on": True, "1": True,
    "false": False, "f": False, "no": False, "n": False, "off": False, "0": False,
}  # fmt: skip
"""What pydantic's lax mode reads as a boolean (msgspec's strict=False knows only some)."""


def _pydantic_lax(value: Any, hint: Any) -> Any:
    """The spellings pydantic's lax mode accepts that msgspec does not: boolean words and
    0.0/1.0, booleans as numbers, and numbers written with surrounding spaces."""
    if hint is bool:
        if isinstance(value, str) and value.strip().lower() in _BOOL_WORDS:
            return _BOOL_WORDS[value.strip().lower()]
        if isinstance(value, float) and value in (0.0, 1.0):
            return bool(value)
    if hint in (int, float) and isinstance(value, str):
        return value.strip()
    if hint in (int, float) and isinstance(value, bool):
        return hint(value)
    return value


def convert(value: Any, hint: Any, path: str) -> Any:
    """``value`` as the field type ``hint``, converted as DeepSpeed's pydantic lax mode does;
    a one-line :class:`ConfigError` naming ``path`` otherwise."""
    for option in _options(hint):
        value = _pydantic_lax(value, option)
    try:
        result = msgspec.convert(value, hint, strict=False)
    except msgspec.ValidationError:
        raise ConfigError(f"{path} must be {_describe(hint)}, got {value!r}") from None
    if isinstance(result, float) and math.isnan(result):
        raise ConfigError(f"{path} must be a number, got NaN")
    return result


def _options(hint: Any) -> tuple[Any, ...]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _describe(hint: Any) -> str:
    """The field type in words, for error messages."""
    words = []
    for option in _options(hint):
        origin = typing.get_origin(option)
        if option is type(None):
            words.append("null")
        elif origin is typing.Literal:
            words.append(f"one of {list(typing.get_args(option))}")
        elif origin in (tuple, list):
            args = typing.get_args(option)
            inner = _describe(args[0]) if args else "values"
            words.append(
                f"a list of {len(args)} x {inner}" if origin is tuple else f"a list of {inner}"
            )
        else:
            words.append(_WORDS.get(option, getattr(option, "__name__", str(option))))
    return " or ".join(words)


def ignored(default: Any, reason: str) -> Any:
    """A field that is read and type-checked but changes nothing here; reported once (when not
    at its default) and documented with ``reason``."""
    return dataclasses.field(default=default, metadata={"ignored": reason})


def refused(default: Any, reason: str) -> Any:
    """A field whose only accepted value is ``default``: any other value would need a feature
    that is not built (``reason``), so it is an error naming the key."""
    return dataclasses.field(default=default, metadata={"refused": reason})


class Block:
    """Mixin for block dataclasses: the tables read by :func:`read_block`.

    ``ALIASES``: DeepSpeed's alternative spellings of a field (``stage3_prefetch_bucket_size``
    is also ``prefetch_bucket_size``). ``KEYS``: every other key DeepSpeed knows, with its
    status. ``AUTO_IS_DEFAULT``: DeepSpeed validates this block with pydantic, which reads an
    unfilled "auto" as the default."""

    __slots__ = ()

    ALIASES: ClassVar[dict[str, str]] = {}
    KEYS: ClassVar[dict[str, KeyStatus]] = {}
    AUTO_IS_DEFAULT: ClassVar[bool] = False


def key_fields(cls: type) -> list[dataclasses.Field[Any]]:
    """The dataclass fields that are ds_config keys (not the reader's own bookkeeping)."""
    return [f for f in dataclasses.fields(cls) if not f.metadata.get("not_a_key")]


def read_block(
    cls: type[T], raw: Mapping[str, Any], path: str = "", notes: Notes | None = None
) -> T:
    """Build ``cls`` from ``raw``; see the module docstring for the rules. Ignored keys and
    defaulted "auto"s are written into ``notes``."""
    notes = notes if notes is not None else Notes()
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in key_fields(cls)}
    names = list(fields)
    aliases: dict[str, str] = getattr(cls, "ALIASES", {})
    table: dict[str, KeyStatus] = getattr(cls, "KEYS", {})
    auto_is_default: bool = getattr(cls, "AUTO_IS_DEFAULT", False)
    prefix = f"{path}." if path else ""
    kwargs: dict[str, Any] = {}
    given_as: dict[str, str] = {}

    def take(name: str, value: Any, where: str) -> None:
        if name in kwargs:
            raise ConfigError(
                f"{where} and {prefix}{given_as[name]} are the same setting; give one"
            )
        hint = hints[name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{where} must be an object {{...}}, got {value!r}")
            kwargs[name] = read_block(hint, value, where, notes)
        else:
            kwargs[name] = convert(value, hint, where)
            meta, default = fields[name].metadata, fields[name].default
            if meta.get("refused") and kwargs[name] != default:
                raise ConfigError(f"{where}={_short(kwargs[name])}: {meta['refused']}")
            if meta.get("ignored") and kwargs[name] != default:
                notes.ignored[where] = meta["ignored"]
        given_as[name] = where[len(prefix) :]

    for key, value in raw.items():
        key = str(key)
        where = f"{prefix}{key}"
        if isinstance(value, str) and value == AUTO:
            if not auto_is_default:
                raise ConfigError(
                    f'"{where}" is "auto" but no value was given for it: pass '
                    f"auto_values={{'{where}': ...}} to initialize() or write the value in the config"
                )
            notes.ignored[where] = '"auto" with no value given: DeepSpeed\'s default is used'
            continue
        name = aliases.get(key, key)
        status = table.get(key)
        if name in names:
            take(name, value, where)
        elif isinstance(status, Deprecated):
            new = status.rewrite(value)
            if new is not None:
                take(aliases.get(status.new_key, status.new_key), new, where)
        elif isinstance(status, Ignored):
            if not is_off(value, (False,)):  # `"wall_clock_breakdown": false` says nothing
                notes.ignored[where] = status.reason
        elif isinstance(status, Refused):
            if not status.accepts(value):
                raise ConfigError(f"{where}={_short(value)}: {status.reason}")
        else:
            known = sorted({*names, *aliases, *table})
            raise ConfigError(f"unknown key {where}{suggest(key, known)}")
    try:
        block = cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as exc:  # __post_init__ checks raise ValueError naming the field
        raise ConfigError(f"{prefix}{exc}") from None
    return block


def _short(value: Any) -> str:
    text = repr(value) if not isinstance(value, Mapping) else "{...}"
    return text if len(text) <= 40 else text[:37] + "..."
