"""What one piece of advice is: the measured evidence, the change, and its price.

A piece of advice is never shown without its evidence (figures with the steps they were measured
on) nor without the formula its price comes from. Prices are per rank and per step, signed so
that positive is a gain: ``saves_bytes`` > 0 frees memory, < 0 costs memory; ``saves_ms`` > 0
makes the step faster, < 0 slower. ``bytes_metric`` / ``ms_metric`` name the measured figure
(zeroscope.state.advice.measure) each price predicts, so a trial run can check it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from zeroscope.state import units

# The advisor's thresholds live with the colours' in AlertRules' module (one place, one help).
from zeroscope.state.alerts import Thresholds as Thresholds

Confidence = Literal["high", "medium", "low"]
Severity = Literal["error", "advice"]


@dataclass(frozen=True, slots=True)
class Change:
    """What to change: ds_config keys (dotted paths, exact values) and/or a code change."""

    ds_config: dict[str, Any] = field(default_factory=dict)
    """Dotted key -> new value, e.g. ``{"zero_optimization.stage": 2}``; ``None`` removes."""
    code: str = ""
    """A change in the training script, in words (activation checkpointing, ``zero.Init``)."""

    @property
    def text(self) -> str:
        parts = [f"{k} = {_json(v)}" for k, v in self.ds_config.items()]
        if self.code:
            parts.append(self.code)
        return "; ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {"ds_config": dict(self.ds_config), "code": self.code, "text": self.text}


def _json(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "(remove)"
    if isinstance(value, dict):
        return "{" + ", ".join(f'"{k}": {_json(v)}' for k, v in value.items()) + "}"
    if isinstance(value, float) and value.is_integer() and abs(value) >= 1e6:
        return f"{value:.0e}".replace("+0", "").replace("+", "")
    return str(value)


@dataclass(frozen=True, slots=True)
class Advice:
    """One change the measurements argue for (see the module docstring for signs)."""

    rule: str
    title: str
    evidence: tuple[str, ...]
    change: Change
    formula: str
    """How the prices follow from the evidence, with the figures put in."""
    confidence: Confidence
    saves_bytes: float | None = None
    saves_ms: float | None = None
    bytes_metric: str = ""
    ms_metric: str = ""
    severity: Severity = "advice"
    ranks: tuple[int, ...] = ()
    gain: float = 0.0
    """What the list is sorted by: the larger of saves_ms / step time and saves_bytes / device
    memory (errors first, as +inf). Set by :func:`zeroscope.state.advice.advise`."""

    def __post_init__(self) -> None:
        if not self.evidence:
            raise ValueError(f"advice {self.rule!r} without evidence")

    def as_dict(self) -> dict[str, Any]:
        """The ``zeroscope advise --json`` shape."""
        return {
            "rule": self.rule,
            "title": self.title,
            "evidence": list(self.evidence),
            "change": self.change.as_dict(),
            "saves_bytes": _finite(self.saves_bytes),
            "saves_ms": _finite(self.saves_ms),
            "confidence": self.confidence,
            "severity": self.severity,
            "formula": self.formula,
            "bytes_metric": self.bytes_metric or None,
            "ms_metric": self.ms_metric or None,
            "ranks": list(self.ranks),
        }


def _finite(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, 3)


@dataclass(frozen=True, slots=True)
class NotJudged:
    """A rule that could not be judged: the figures it needs are absent (said, not guessed)."""

    rule: str
    missing: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "evidence": [],
            "change": None,
            "saves_bytes": None,
            "saves_ms": None,
            "confidence": None,
            "missing": self.missing,
        }


Finding = Advice | NotJudged
"""What a rule returns: advice, a note that it lacked its figures, or nothing (None)."""


def ms(seconds: float | None) -> str:
    """Milliseconds with sensible precision ("NA" for None)."""
    if seconds is None:
        return "NA"
    v = seconds * 1e3
    return f"{v:.2f} ms" if abs(v) < 10 else f"{v:.1f} ms" if abs(v) < 100 else f"{v:.0f} ms"


def nbytes(value: float | None) -> str:
    """Bytes in the decimal units every other view prints (``units.size``: 1 MB = 1e6 bytes),
    so the advice's figures read the same as the memory screen's beside them."""
    return units.size(value)
