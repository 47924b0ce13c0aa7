"""Layering (ARCHITECTURE.md): engine/ and agent/ never import textual or the UI; zeroscope/ never
imports the engine. Checked two ways: an AST scan here, and ruff's banned-api (nested ruff.toml),
which is proven to fire on a deliberate violation."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FORBIDDEN = {
    "engine": ("textual", "zmq", "zeroscope.tui", "zeroscope.cli", "zeroscope.collector"),
    "agent": ("textual", "zeroscope.engine", "zeroscope.tui", "zeroscope.cli"),
    "zeroscope": ("zeroscope.engine", "engine"),
}


def imported_modules(source: str, package: str) -> set[str]:
    """Absolute module names a source file imports (relative imports resolved in ``package``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: max(0, len(package.split(".")) - node.level + 1)]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            names.add(mod)
            names.update(f"{mod}.{alias.name}" for alias in node.names)
    return names


def violations(folder: str, source: str, package: str) -> list[str]:
    bad = []
    for name in imported_modules(source, package):
        for banned in FORBIDDEN[folder]:
            if name == banned or name.startswith(banned + "."):
                bad.append(f"{folder} imports {name}")
    return bad


def test_no_layer_imports_what_it_must_not() -> None:
    found = []
    for folder in FORBIDDEN:
        for path in sorted((ROOT / folder).rglob("*.py")):
            package = "zeroscope" if folder == "zeroscope" else f"zeroscope.{folder}"
            rel = path.relative_to(ROOT / folder).with_suffix("").parts[:-1]
            package = ".".join([package, *rel])
            found += [
                f"{path.relative_to(ROOT)}: {v}"
                for v in violations(folder, path.read_text(), package)
            ]
    assert found == []


def test_scan_catches_a_deliberate_violation() -> None:
    assert violations("engine", "import textual\n", "zeroscope.engine")
    assert violations("agent", "from textual.app import App\n", "zeroscope.agent")
    assert violations("zeroscope", "from zeroscope.engine import config\n", "zeroscope")
    assert violations("zeroscope", "from ..engine import config\n", "zeroscope.tui")
    assert not violations("zeroscope", "from zeroscope.agent import schema\n", "zeroscope")


@pytest.mark.parametrize(
    ("path", "source"),
    [
        ("engine/_probe.py", "import textual\n"),
        ("agent/_probe.py", "from textual.widgets import Static\n"),
        ("zeroscope/_probe.py", "from zeroscope.engine import config\n"),
    ],
)
def test_ruff_banned_api_fires(path: str, source: str) -> None:
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    result = subprocess.run(
        [ruff, "check", "--no-cache", "--stdin-filename", path, "-"],
        input=source + "print(1)\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode != 0
    assert "TID251" in result.stdout
