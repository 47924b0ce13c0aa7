"""Every DeepSpeed ds_config key and API name, with what the engine does with it, read from the
code itself: the config dataclasses and their ``ALIASES`` / ``KEYS`` tables (engine/config*.py),
the DeepSpeed surface package (engine/deepspeed/) and the engine class.

    python -m zeroscope.engine.keys --markdown     # the tables in docs/engine.md

``tests/test_deepspeed_keys.py`` checks that docs/engine.md holds exactly this output and that
every key DeepSpeed 0.19.8's config reader looks up, and every public member of its engine
class, is listed here.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
import typing
from dataclasses import dataclass
from typing import Any

from .config import DeepSpeedConfig
from .config_blocks import _LEGACY_FUSION, _SCHEDULERS, _UNSUPPORTED_SCHEDULERS, AdamParams
from .config_parse import Deprecated, Ignored, Refused, key_fields
from .deepspeed.status import (
    ENGINE_ATTRIBUTES,
    ENGINE_DIFFERENT,
    ENGINE_NOT_BUILT,
    NOT_BUILT_MODULES,
    SURFACE_MODULES,
)

IMPLEMENTED = "implemented"
IGNORED = "accepted, ignored"
REFUSED = "refused unless off"
ALIAS = "alias"
DEPRECATED = "deprecated alias"
NOT_BUILT = "not built"


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    status: str
    why: str = ""


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        return f"default {f.default!r}"
    return "a block" if f.default_factory is not dataclasses.MISSING else "required"


def _block_rows(cls: type, prefix: str) -> list[Row]:
    rows: list[Row] = []
    hints = typing.get_type_hints(cls)
    for f in key_fields(cls):
        path = f"{prefix}{f.name}"
        hint = hints[f.name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            rows.append(Row(path, IMPLEMENTED, "a block"))
            rows += _block_rows(hint, f"{path}.")
        elif reason := f.metadata.get("ignored"):
            rows.append(Row(path, IGNORED, reason))
        elif reason := f.metadata.get("refused"):
            rows.append(Row(path, REFUSED, f"{reason} (accepted: {f.default!r})"))
        else:
            rows.append(Row(path, IMPLEMENTED, _default(f)))
    for alias, target in getattr(cls, "ALIASES", {}).items():
        rows.append(Row(f"{prefix}{alias}", ALIAS, f"of {prefix}{target}"))
    for key, status in getattr(cls, "KEYS", {}).items():
        path = f"{prefix}{key}"
        if isinstance(status, Ignored):
            rows.append(Row(path, IGNORED, status.reason))
        elif isinstance(status, Refused):
            rows.append(Row(path, REFUSED, status.reason))
        elif isinstance(status, Deprecated):
            rows.append(Row(path, DEPRECATED, f"rewritten onto {prefix}{status.new_key}"))
    return rows


def config_rows() -> list[Row]:
    """Every ds_config key the engine knows, with its status, sorted by key."""
    rows = _block_rows(DeepSpeedConfig, "")
    rows = [r for r in rows if r.name not in ("optimizer", "scheduler")]
    rows += [
        Row("optimizer", IMPLEMENTED, "a block"),
        Row("optimizer.type", IMPLEMENTED, "Adam, AdamW, torch.optim types; Lamb, Lion... refused"),
        Row("optimizer.params", IMPLEMENTED, "a block"),
        Row("optimizer.legacy_fusion", IGNORED, _LEGACY_FUSION.reason),
        *_block_rows(AdamParams, "optimizer.params."),
        Row("scheduler", IMPLEMENTED, "a block"),
        Row(
            "scheduler.type",
            IMPLEMENTED,
            f"{', '.join(_SCHEDULERS)}; refused: {', '.join(_UNSUPPORTED_SCHEDULERS)}",
        ),
        Row("scheduler.params", IMPLEMENTED, "a block (per type)"),
    ]
    seen: set[str] = set()
    for params in _SCHEDULERS.values():
        for row in _block_rows(params, "scheduler.params."):
            if row.name not in seen:
                seen.add(row.name)
                rows.append(Row(row.name, row.status, "" if row.status == IMPLEMENTED else row.why))
    return sorted(rows, key=lambda r: r.name)


# -- API names ----------------------------------------------------------------------------------


def _public(obj: Any) -> list[str]:
    names = getattr(obj, "__all__", None)
    if names is None:
        names = [n for n in vars(obj) if not n.startswith("_")]
    return sorted(n for n in names if not n.startswith("_"))


def engine_members() -> list[str]:
    """The DeepSpeed engine members the engine implements (methods, properties, attributes)."""
    from .engine import ZeroEngine

    internal = {"reporter", "scaler", "strategy", "comm"}
    names = {n for n in dir(ZeroEngine) if not n.startswith("_")} | set(ENGINE_ATTRIBUTES)
    names |= {"_zero3_consolidated_16bit_state_dict"}
    return sorted(names - internal - set(ENGINE_DIFFERENT))


def api_rows() -> list[Row]:
    """DeepSpeed's module-level names and engine members, with their status."""
    rows = []
    for ds_name, module_name in SURFACE_MODULES.items():
        module = importlib.import_module(module_name)
        for name in _public(module):
            value = getattr(module, name)
            if isinstance(value, type(sys)) and ds_name == "deepspeed":
                continue  # submodules have their own rows
            rows.append(Row(f"{ds_name}.{name}", IMPLEMENTED))
    rows += [Row(name, NOT_BUILT, why) for name, why in NOT_BUILT_MODULES.items()]
    for name in engine_members():
        rows.append(Row(f"engine.{name}", IMPLEMENTED, ENGINE_ATTRIBUTES.get(name, "")))
    rows += [Row(f"engine.{name}", "differs", why) for name, why in ENGINE_DIFFERENT.items()]
    for why, names in ENGINE_NOT_BUILT.items():
        rows.append(Row(", ".join(f"engine.{n}" for n in sorted(names)), NOT_BUILT, why))
    return rows


def _table(rows: list[Row], first: str) -> list[str]:
    lines = [f"| {first} | status | why / notes |", "|---|---|---|"]
    for r in rows:
        lines.append(f"| `{r.name}` | {r.status} | {r.why.replace('|', '/')} |")
    return lines


def markdown() -> str:
    """The generated section of docs/engine.md."""
    return "\n".join(
        [
            "### ds_config keys",
            "",
            *_table(config_rows(), "key"),
            "",
            "### DeepSpeed API names",
            "",
            *_table(api_rows(), "name"),
            "",
        ]
    )


BEGIN, END = "<!-- BEGIN keys.py -->", "<!-- END keys.py -->"


def update(path: str) -> None:
    """Rewrite the generated section of a markdown file (between BEGIN and END)."""
    with open(path) as f:
        text = f.read()
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    with open(path, "w") as f:
        f.write(f"{head}{BEGIN}\n{markdown()}{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zeroscope.engine.keys", description=__doc__)
    parser.add_argument("--markdown", action="store_true", help="print the docs/engine.md tables")
    parser.add_argument("--update", metavar="FILE.md", help="rewrite FILE.md's generated section")
    args = parser.parse_args(argv)
    if args.update:
        update(args.update)
    elif args.markdown:
        sys.stdout.write(markdown())
    else:
        for row in config_rows():
            print(f"{row.name}\t{row.status}\t{row.why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
