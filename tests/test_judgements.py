"""Judgements live in one place (zeroscope.state.alerts.AlertRules): each level against
hand-written thresholds at its boundaries, and no view or command compares a figure with a
number of its own (an AST scan, so a new ``if share > 0.3`` in a screen fails here)."""

from __future__ import annotations

import ast
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


# A comparison with a non-integer number in a view is a judgement or arithmetic of its own.
# These two are drawing, not figures: a chart label's float tolerance, and the redraw pace.
ALLOWED = {
    ("zeroscope/tui/charts.py", "abs(level - round(level)) < 1e-09"),
    ("zeroscope/tui/history_plots.py", "self._drawn_at - self._in_flight_at > 1.0"),
}


def _float_comparisons(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            numbers = [
                o
                for o in operands
                if isinstance(o, ast.Constant)
                and isinstance(o.value, float)
                and not o.value.is_integer()
            ]
            if numbers:
                found.append(ast.unparse(node))
    return found


@pytest.mark.parametrize("folder", ["zeroscope/tui", "zeroscope/commands"])
def test_views_compare_no_figure_with_a_number(folder: str) -> None:
    found = [
        (str(p.relative_to(ROOT)), expr)
        for p in sorted((ROOT / folder).glob("*.py"))
        for expr in _float_comparisons(p)
    ]
    assert set(found) <= ALLOWED, set(found) - ALLOWED


def test_the_scan_catches_a_threshold(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("def style(share):\n    return 'red' if share > 0.3 else ''\n")
    assert _float_comparisons(probe) == ["share > 0.3"]
