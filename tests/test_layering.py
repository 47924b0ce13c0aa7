"""Layering (ARCHITECTURE.md): engine/ and agent/ never import textual or the viewer side;
zeroscope/ never imports the engine nor the agent's runtime (only the wire schema); the wire
schema imports nothing of the project; zeroscope/state (where every figure is computed) imports
no view, no I/O and no torch; views (zeroscope/tui) compute no figure of their own. Checked two
ways: an AST scan here, and ruff's banned-api (nested ruff.toml), which is proven to fire on a
deliberate violation of each rule."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

AGENT_RUNTIME = tuple(
    f"zeroscope.agent.{m}"
    for m in (
        "api",
        "live",
        "publish",
        "comm",
        "sampler",
        "activations",
        "scalars",
        "timeline",
        "pending",
        "device_memory",
        "collector_probe",
    )
)
VIEWER = ("zeroscope.engine", "engine", *AGENT_RUNTIME)

FORBIDDEN: dict[str, tuple[str, ...]] = {
    "engine": (
        "textual",
        "zmq",
        "zeroscope.tui",
        "zeroscope.cli",
        "zeroscope.collector",
        "zeroscope.state",
    ),
    "agent": (
        "textual",
        "zeroscope.engine",
        "zeroscope.tui",
        "zeroscope.cli",
        "zeroscope.state",
        "zeroscope.collector",
    ),
    # The wire schema: both sides import it, so it imports nothing of the project (nor torch).
    "agent/schema.py": ("zeroscope", "engine", "agent", "torch", "textual", "zmq"),
    "zeroscope": VIEWER,
    "zeroscope/state": (
        *VIEWER,
        "textual",
        "rich",
        "zeroscope.tui",
        "zeroscope.commands",
        "zeroscope.collector",
        "zeroscope.store.sources",
        "zeroscope.store.trace",
        "zmq",
        "torch",
    ),
    "zeroscope/tui": (*VIEWER, "zeroscope.state.formulas", "zeroscope.state.bandwidth"),
}
"""Path (a folder, or one file) -> module prefixes no file there may import. A file obeys
every entry whose path contains it."""

EXEMPT: dict[str, tuple[str, ...]] = {
    # A worker node's launcher checks the collector's door exactly as its ranks will knock: it
    # is launcher-side, not viewer-side (it shows nothing), and imports only the probe.
    "zeroscope/remote/multinode.py": ("zeroscope.agent.collector_probe",),
}
"""File -> imports it may make despite FORBIDDEN, each with its reason above."""


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


def _package(path: Path) -> str:
    """The import package of a source file (engine/ and agent/ ship as zeroscope.engine and
    zeroscope.agent)."""
    rel = path.relative_to(ROOT).with_suffix("").parts[:-1]
    top = "zeroscope" if rel[0] == "zeroscope" else f"zeroscope.{rel[0]}"
    return ".".join([top, *rel[1:]])


def violations(rule: str, source: str, package: str, path: str = "") -> list[str]:
    bad = []
    allowed = EXEMPT.get(path, ())
    for name in imported_modules(source, package):
        if any(name == a or name.startswith(a + ".") for a in allowed):
            continue
        for banned in FORBIDDEN[rule]:
            if name == banned or name.startswith(banned + "."):
                bad.append(f"{rule} imports {name}")
    return bad


def test_no_layer_imports_what_it_must_not() -> None:
    found = []
    for rule in FORBIDDEN:
        target = ROOT / rule
        paths = [target] if target.suffix == ".py" else sorted(target.rglob("*.py"))
        for path in paths:
            found += [
                f"{path.relative_to(ROOT)}: {v}"
                for v in violations(
                    rule, path.read_text(), _package(path), str(path.relative_to(ROOT))
                )
            ]
    assert found == []


def test_scan_catches_a_deliberate_violation() -> None:
    assert violations("engine", "import textual\n", "zeroscope.engine")
    assert violations("agent", "from textual.app import App\n", "zeroscope.agent")
    assert violations("zeroscope", "from zeroscope.engine import config\n", "zeroscope")
    assert violations("zeroscope", "from ..engine import config\n", "zeroscope.tui")
    assert violations("zeroscope", "from zeroscope.agent.live import start_agent\n", "zeroscope")
    assert not violations("zeroscope", "from zeroscope.agent import schema\n", "zeroscope")
    assert violations("agent/schema.py", "from .api import telemetry\n", "zeroscope.agent")
    assert violations("agent/schema.py", "import torch\n", "zeroscope.agent")
    assert not violations("agent/schema.py", "import msgspec\n", "zeroscope.agent")
    assert violations("zeroscope/state", "from textual.widget import Widget\n", "zeroscope.state")
    assert violations("zeroscope/state", "from ..tui import app\n", "zeroscope.state")
    assert violations("zeroscope/tui", "from zeroscope.state.bandwidth import busbw\n", "")
    assert not violations("zeroscope/tui", "from zeroscope.state import units\n", "")


@pytest.mark.parametrize(
    ("path", "source"),
    [
        ("engine/_probe.py", "import textual\n"),
        ("agent/_probe.py", "from textual.widgets import Static\n"),
        ("agent/_probe.py", "from zeroscope.state import ClusterState\n"),
        ("zeroscope/_probe.py", "from zeroscope.engine import config\n"),
        ("zeroscope/_probe.py", "from zeroscope.agent.live import start_agent\n"),
        ("zeroscope/state/_probe.py", "from textual.widget import Widget\n"),
        ("zeroscope/state/_probe.py", "import torch\n"),
        ("zeroscope/state/_probe.py", "from zeroscope.engine import config\n"),
        ("zeroscope/tui/_probe.py", "from zeroscope.state.formulas import model_state_bytes\n"),
        ("zeroscope/tui/_probe.py", "from zeroscope.agent.api import telemetry\n"),
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
