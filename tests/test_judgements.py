"""Judgements live in one place (zeroscope.state.alerts.AlertRules): each level against
hand-written thresholds at its boundaries, and no view or command compares a figure with a
number of its own (an AST scan, so a new ``if share > 0.3`` in a screen fails here)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from zeroscope.state import AlertRules

ROOT = Path(__file__).resolve().parent.parent


def test_levels_at_their_boundaries() -> None:
    rules = AlertRules()
    # Rank table slowness: yellow above 1.05x, red above 1.2x.
    assert [rules.slowness_level(x) for x in (None, 1.0, 1.05, 1.06, 1.2, 1.21)] == [
        "na",
        "ok",
        "ok",
        "warn",
        "warn",
        "bad",
    ]
    # A rank's exposed share: bad above the exposed alert's 30 %.
    assert [rules.exposed_level(x) for x in (None, 0.3, 0.31)] == ["na", "ok", "bad"]
    # A stage's bubble: bad more than 10 points above its plan; an unknown plan is NA, not 0.
    assert rules.bubble_level(0.35, 0.2) == "bad"
    assert rules.bubble_level(0.25, 0.2) == "ok"
    assert rules.bubble_level(0.5, None) == rules.bubble_level(None, 0.2) == "na"
    # Traffic: met within 0.9-1.1x.
    assert [rules.traffic_level(x) for x in (0.89, 0.9, 1.1, 1.11, None)] == [
        "warn",
        "ok",
        "ok",
        "warn",
        "na",
    ]
    # Memory: bad beyond ±10 %.
    assert [rules.memory_level(x) for x in (-0.11, -0.1, 0.1, 0.11)] == ["bad", "ok", "ok", "bad"]


def test_heat_levels_absolute_and_relative() -> None:
    rules = AlertRules()
    # Slowness bands on the table's scale, 1.05 / 1.2, then 1.3 (absolute).
    assert rules.heat_levels("slowness", [1.0, 1.1, 1.25, 1.4, None]) == [0, 1, 2, 3, None]
    assert rules.heat_levels("slowness", [1.15, 1.2]) == [1, 1]  # warn on the table too
    # Exposed share in thirds of the exposed alert's 30 %.
    assert rules.heat_levels("exposed", [0.05, 0.15, 0.25, 0.35]) == [0, 1, 2, 3]
    # Memory as a share of the largest rank's: 50 %, 80 %, 90 %, 100 % of 10.
    assert rules.heat_levels("memory", [5.0, 8.0, 9.0, 10.0]) == [0, 1, 2, 3]
    assert rules.heat_levels("step", [0.0, 0.0]) == [0, 0]  # nothing measured above 0


def test_thresholds_are_listed_for_the_help() -> None:
    rules = AlertRules(slowness_warn=1.1, slowness_bad=1.5)
    [slow] = [line for line in rules.thresholds() if line.startswith("slow ")]
    assert "1.10x" in slow and "1.50x" in slow


# Views and commands format: a comparison of a figure with a number, or with one of AlertRules'
# thresholds, is a judgement of their own, and a call of a judgement (``*_level``,
# ``heat_levels``, ``heat_cuts``) is one taken outside the view-model. Layout is not a figure:
# a comparison whose other side is ``len(...)``, ``n % k`` or one of these layout names passes,
# and so does one of an exit status.
LAYOUT_NAMES = {"i", "width", "height", "cursor", "room", "start", "per_line"}
# A process's exit status is not a figure of the job either.
STATUS_NAMES = {"code", "exit_code", "returncode"}

# The rest that may compare with a number, by (file, function), each for a reason that is not a
# figure's judgement.
ALLOWED_FUNCTIONS = {
    # Drawing: an empty or zero-sized span/total/scale guard before scaling to cells, the
    # rounding that keeps a non-zero part visible in a bar, a tick count.
    ("zeroscope/tui/charts.py", "stacked_bar"),
    ("zeroscope/tui/charts.py", "sparkline"),
    ("zeroscope/tui/charts.py", "timeline"),
    ("zeroscope/tui/pipeline_screen.py", "timeline"),
    ("zeroscope/tui/rank_screen.py", "_phase_row"),
    ("zeroscope/tui/history_plot.py", "nice_ticks"),
    # The redraw pace (seconds of wall clock between frames), not a figure of the job.
    ("zeroscope/tui/history_plots.py", "poke"),
    ("zeroscope/tui/history_plots.py", "_show"),
    # What the user typed: argparse types and option checks.
    ("zeroscope/commands/advise.py", "_bytes"),
    ("zeroscope/commands/advise.py", "_preflight"),
    ("zeroscope/commands/estimate.py", "_count"),
    ("zeroscope/commands/estimate.py", "_trainable"),
    ("zeroscope/commands/estimate.py", "_positive_int"),
    ("zeroscope/commands/estimate.py", "main"),
    # An empty trace file.
    ("zeroscope/commands/serve.py", "main"),
}

THRESHOLDS = {f.name for f in dataclasses.fields(AlertRules)}
JUDGEMENTS = {
    name
    for name in dir(AlertRules)
    if name.endswith("_level") or name in ("heat_levels", "heat_cuts")
}


def _is_number(node: ast.expr) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    )


def _is_layout(node: ast.expr) -> bool:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len":
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        return True
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
    return name in LAYOUT_NAMES or name in STATUS_NAMES


def _is_threshold(node: ast.expr, aliases: set[str]) -> bool:
    """Reads one of AlertRules' thresholds, directly or through a local it was assigned to."""
    return any(
        (isinstance(n, ast.Attribute) and n.attr in THRESHOLDS)
        or (isinstance(n, ast.Name) and n.id in aliases)
        for n in ast.walk(node)
    )


def judgements_in(source: str) -> list[tuple[str, str]]:
    """(enclosing function, expression) of every judgement in ``source``: a comparison of a
    non-layout operand with a number or a threshold, or a call of a judgement method."""
    found = []
    tree = ast.parse(source)
    for fn in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]:
        aliases = {
            t.id
            for n in ast.walk(fn)
            if isinstance(n, ast.Assign) and _is_threshold(n.value, set())
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        for node in ast.walk(fn):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                figures = [o for o in operands if not _is_number(o) and not _is_layout(o)]
                if figures and (
                    any(_is_number(o) for o in operands)
                    or any(_is_threshold(o, aliases) for o in operands)
                ):
                    found.append((fn.name, ast.unparse(node)))
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in JUDGEMENTS
            ):
                found.append((fn.name, ast.unparse(node)))
    return found


def _scan(folder: str) -> dict[tuple[str, str], list[str]]:
    found: dict[tuple[str, str], list[str]] = {}
    for path in sorted((ROOT / folder).glob("*.py")):
        for fn, expr in judgements_in(path.read_text()):
            found.setdefault((str(path.relative_to(ROOT)), fn), []).append(expr)
    return found


@pytest.mark.parametrize("folder", ["zeroscope/tui", "zeroscope/commands"])
def test_views_compare_no_figure_with_a_number(folder: str) -> None:
    found = _scan(folder)
    judged = {where: exprs for where, exprs in found.items() if where not in ALLOWED_FUNCTIONS}
    assert not judged, judged
    # Every allowance is still needed (a stale one would let a new threshold slip in there).
    mine = {where for where in ALLOWED_FUNCTIONS if where[0].startswith(folder)}
    assert mine <= set(found), mine - set(found)


def test_the_scan_catches_a_threshold() -> None:
    probes = {
        "def style(share):\n    return 'red' if share > 0.3 else ''\n": "share > 0.3",
        "def f(view):\n    return view.ratio >= 1\n": "view.ratio >= 1",
        "def f(s, rules):\n    return s.last > rules.exposed_max\n": "s.last > rules.exposed_max",
        "def f(s):\n    limit = s.rules.exposed_max\n    return s.last > limit\n": "s.last > limit",
        "def f(s):\n    return s.rules.slowness_level(s.x)\n": "s.rules.slowness_level(s.x)",
        "def f(v):\n    return 'saves' if v >= 0 else 'costs'\n": "v >= 0",
    }
    for source, expr in probes.items():
        assert [e for _, e in judgements_in(source)] == [expr], source
    # Layout passes: a width, a count, an alternation.
    layout = "def f(width, rows, pp):\n    return width < 84 or len(rows) > 1 or pp % 2 == 0\n"
    assert judgements_in(layout) == []


def test_the_advisor_and_the_straggler_alert_have_their_own_listed_rules(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The advisor's thresholds are AlertRules' (``advice``), listed in the same help; the
    straggler alert's excess rule is its own (not the slowness colours'), listed too."""
    from zeroscope.state import advice
    from zeroscope.state.advice import advise
    from zeroscope.state.advice.model import Thresholds
    from zeroscope.state.cluster import ClusterState

    rules = AlertRules(advice=Thresholds(bubble_excess=0.07, bubble_bound_max=0.3))
    lines = rules.thresholds()
    assert any("1F1B bound + 7% or bound > 30%" in line for line in lines), lines
    [straggler] = [line for line in lines if line.startswith("straggler ")]
    assert "max(10 ms, 10% of the median step) in 3 of 5 steps" in straggler
    # 10 ms floor on a short step, 10 % of a long one.
    assert rules.straggler_limit_s(0.05) == 0.010
    assert rules.straggler_limit_s(2.0) == pytest.approx(0.2)
    # The advisor reads the state's thresholds unless it is given its own.
    seen: list[Thresholds] = []
    monkeypatch.setattr(advice, "RULES", (("probe", lambda f, t: seen.append(t)),))
    advise(ClusterState(rules=rules))
    own = Thresholds(skipped_min=0.5)
    advise(ClusterState(rules=rules), thresholds=own)
    assert seen == [rules.advice, own]
