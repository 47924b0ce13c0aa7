"""Layering (ARCHITECTURE.md), as allowlist contracts checked by import-linter
([tool.importlinter] in pyproject.toml, run by ``make lint`` through .ci/lint_imports.py):
the viewer side imports, of the agent, only the wire schema (three launcher-side exceptions,
each named with its reason); engine/ and agent/ never import the viewer side, Textual or Rich;
the agent never imports the engine; the wire schema stands alone; zeroscope/state imports no
UI, no I/O and no torch; views and commands import, of state, only the view-model API
(zeroscope.state.viewmodel) and units. Here: the contracts hold, each one fails on a deliberate violation, no package of
zeroscope/ escapes them, and the attach's bootstrap path imports no torch or Textual."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
LINT = ROOT / ".ci" / "lint_imports.py"
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def _lint(*probes: tuple[str, str]) -> subprocess.CompletedProcess[str]:
    args = [f"--probe={path}={source}" for path, source in probes]
    return subprocess.run(
        [sys.executable, str(LINT), *args], capture_output=True, text=True, cwd=ROOT, timeout=240
    )


def _contract(contract_id: str) -> dict:
    [found] = [c for c in CONFIG["contracts"] if c["id"] == contract_id]
    return found


def test_the_import_contracts_hold() -> None:
    result = _lint()
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Contracts: {len(CONFIG['contracts'])} kept, 0 broken." in result.stdout


SCHEMA = (ROOT / "agent" / "schema.py").read_text()

VIOLATIONS = [
    # (probe file, its source, the contract that must break, the import it must name)
    ("engine/_probe.py", "import textual", "engine-agent-no-viewer", "textual"),
    (
        "agent/_probe.py",
        "from zeroscope.state import ClusterState",
        "engine-agent-no-viewer",
        "zeroscope.state",
    ),
    (
        "agent/_probe2.py",
        "from zeroscope.engine import config",
        "engine-reports-through-api",
        "zeroscope.engine.config",
    ),
    ("engine/_probe2.py", "import zmq", "engine-no-zmq", "zmq"),
    ("agent/schema.py", SCHEMA + "\nimport torch\n", "schema-stands-alone", "torch"),
    (
        "zeroscope/tui/_probe.py",
        "from zeroscope.agent.live import start_agent",
        "viewer-reads-schema-only",
        "zeroscope.agent.live",
    ),
    (
        "zeroscope/store/_probe.py",
        "from zeroscope.agent.attach import install",
        "viewer-reads-schema-only",
        "zeroscope.agent.attach.install",
    ),
    (
        "zeroscope/run/_probe.py",
        "from zeroscope.engine import config",
        "viewer-reads-schema-only",
        "zeroscope.engine.config",
    ),
    ("zeroscope/state/_probe.py", "import textual", "state-is-pure", "textual"),
    ("zeroscope/state/_probe2.py", "import os", "state-is-pure", "os"),
    (
        "zeroscope/state/_probe3.py",
        "from zeroscope.tui import app",
        "viewer-layers",
        "zeroscope.tui.app",
    ),
    (
        "zeroscope/tui/_probe2.py",
        "from zeroscope.state.formulas import model_state_bytes",
        "views-read-the-view-model",
        "zeroscope.state.formulas",
    ),
    (
        "zeroscope/commands/_probe.py",
        "from zeroscope.state.bandwidth import busbw",
        "views-read-the-view-model",
        "zeroscope.state.bandwidth",
    ),
    (
        "zeroscope/tui/_probe4.py",
        "from zeroscope.state.rank import summarize",
        "views-read-the-view-model",
        "zeroscope.state.rank",
    ),
    # The allowlist: state's package itself (its re-exports), a module behind the view-model
    # (history, alerts' rules) and a view-model module rather than its package are all refused.
    (
        "zeroscope/tui/_probe5.py",
        "from zeroscope.state import ClusterState",
        "views-read-the-view-model",
        "zeroscope.state",
    ),
    (
        "zeroscope/commands/_probe2.py",
        "from zeroscope.state.history import StepSeries",
        "views-read-the-view-model",
        "zeroscope.state.history",
    ),
    (
        "zeroscope/tui/_probe6.py",
        "from zeroscope.state.alerts import AlertRules",
        "views-read-the-view-model",
        "zeroscope.state.alerts",
    ),
    (
        "zeroscope/tui/_probe3.py",
        "from zeroscope.commands import summary",
        "viewer-layers",
        "zeroscope.commands.summary",
    ),
]


def _module(path: str) -> str:
    parts = Path(path).with_suffix("").parts
    return ".".join(parts if parts[0] == "zeroscope" else ("zeroscope", *parts))


def _sections(output: str) -> dict[str, str]:
    """Each broken contract's report, by contract id (the report is headed by its name)."""
    broken = output.split("Broken contracts", 1)[-1]
    names = {c["name"]: c["id"] for c in CONFIG["contracts"]}
    flat = " ".join(broken.split())  # the report wraps long names
    starts = sorted((flat.find(" ".join(n.split())), i) for n, i in names.items())
    starts = [(at, i) for at, i in starts if at >= 0]
    return {
        i: flat[at : (starts[k + 1][0] if k + 1 < len(starts) else len(flat))]
        for k, (at, i) in enumerate(starts)
    }


def test_a_deliberate_violation_in_each_layer_breaks_its_contract() -> None:
    """All probes at once in a throwaway copy of the layout (the repository is never written):
    each must be reported under the contract it breaks, and every contract breaks."""
    result = _lint(*((path, source) for path, source, _, _ in VIOLATIONS))
    assert result.returncode != 0
    sections = _sections(result.stdout)
    for path, _, contract, imported in VIOLATIONS:
        line = f"{_module(path)} -> {imported}"
        assert line in sections.get(contract, ""), (contract, line, result.stdout)
    assert {c for _, _, c, _ in VIOLATIONS} == {c["id"] for c in CONFIG["contracts"]}


def test_every_package_of_zeroscope_is_under_a_contract() -> None:
    """The contracts name the viewer side's packages one by one (so the agent and engine can be
    excluded): a new package or top-level module must be added to them, not slip past."""
    children = {
        f"zeroscope.{p.stem}"
        for p in (ROOT / "zeroscope").iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()
    }
    viewer = set(_contract("viewer-reads-schema-only")["source_modules"])
    assert children == viewer
    assert set(_contract("engine-agent-no-viewer")["forbidden_modules"]) >= viewer


BOOTSTRAP_PROBE = textwrap.dedent(
    """
    import sys
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "textual", "rich",
                                                                  "numpy", "zmq"))
    attach = sorted(m for m in sys.modules if m.startswith("zeroscope.agent.attach"))
    print("heavy", heavy)
    print("attach", attach)
    """
)


def test_the_bootstrap_path_imports_no_torch_or_textual() -> None:
    """A worker's start-up with the attach on (sitecustomize -> attach install -> postimport)
    in a fresh interpreter: the attach is installed, and nothing heavy was imported for it (torch
    is hooked, not loaded; the job pays for it only if it imports torch itself)."""
    from zeroscope.agent.attach import pythonpath_with_bootstrap
    from zeroscope.remote.ssh import free_port

    env = dict(os.environ)
    env["PYTHONPATH"] = pythonpath_with_bootstrap(str(ROOT))
    env["ZEROSCOPE_COLLECTOR"] = f"tcp://127.0.0.1:{free_port()}"  # nothing listens: none needed
    env.pop("ZEROSCOPE_ATTACH", None)
    env.pop("ZEROSCOPE_BOOTSTRAP_HOOKS", None)
    out = subprocess.run(
        [sys.executable, "-c", BOOTSTRAP_PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.splitlines()
    assert "heavy []" in out, out
    [attach] = [line for line in out if line.startswith("attach ")]
    # The attach did install (else "nothing heavy" would prove nothing).
    assert "'zeroscope.agent.attach.install'" in attach, out
    assert "'zeroscope.agent.attach.postimport'" in attach, out
