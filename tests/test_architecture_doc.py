"""ARCHITECTURE.md names the functions a reader should open (``zeroscope.state.bandwidth.wire_bytes``
and the like): every backticked ``zeroscope.…`` name in it must exist, so the map cannot point
at a function that was renamed or moved. And every package of the project has its row."""

from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "ARCHITECTURE.md").read_text()
NAME = re.compile(r"`(zeroscope(?:\.[A-Za-z_]\w*)+)`")


def resolve(dotted: str) -> bool:
    """Whether ``dotted`` is a module, or an attribute (a class's method, property, dataclass or
    msgspec field) reached from the longest importable module prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for i, name in enumerate(parts[cut:]):
            if hasattr(obj, name):
                obj = getattr(obj, name)
                continue
            fields = (
                {f.name for f in dataclasses.fields(obj)}
                if dataclasses.is_dataclass(obj)
                else set()
            )
            fields |= set(getattr(obj, "__struct_fields__", ()))
            return name in fields and i == len(parts[cut:]) - 1
        return True
    return False


def test_every_name_the_doc_cites_exists() -> None:
    names = sorted(set(NAME.findall(DOC)))
    assert len(names) > 60  # the map names functions, not only packages
    assert [n for n in names if not resolve(n)] == []


def test_the_resolver_rejects_a_missing_name() -> None:
    assert resolve("zeroscope.state.bandwidth.wire_bytes")
    assert resolve("zeroscope.state.rank.StepSummary.params")  # a dataclass field
    assert resolve("zeroscope.agent.schema.Collective.nbytes")  # a msgspec field
    assert not resolve("zeroscope.state.bandwidth.no_such_function")
    assert not resolve("zeroscope.state.no_such_module.f")


def test_every_package_has_its_row() -> None:
    packages = [p.name for p in (ROOT / "zeroscope").iterdir() if (p / "__init__.py").exists()]
    packages += ["engine", "agent", "agent/attach", "agent/_seam.c"]
    for package in packages:
        if "/" in package or package in ("engine", "agent"):
            assert f"`{package}" in DOC, package
        else:
            assert f"`{package}/`" in DOC or f"`zeroscope.{package}" in DOC, package
