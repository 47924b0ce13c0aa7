"""ClusterState: the pure-Python model of a job that every view reads (no Textual here).

This package is the only place a derived figure is computed: throughput, busbw and volume
(``bandwidth``), exposed share, per-rank and run aggregates (``rank``, ``totals``), stragglers
and slow links (``stragglers``), pipeline bubbles (``pipeline``), predicted memory and traffic
(``prediction``, ``formulas``, ``estimate``), alerts and every colour's threshold (``alerts``:
``AlertRules`` returns a level per figure), per-step series (``history``) and the run report
(``report``). Screens, headless lines, ``summary``, ``export``, ``replay`` and ``estimate`` only
format what it returns.
"""

from . import bandwidth, units
from .alerts import Alert, AlertRules, Level
from .cluster import ClusterState, StepAggregate
from .rank import OpTotals, RankState, StepSummary
from .stragglers import Finding, Standing
from .totals import ClusterTotals, RankTotals

__all__ = [
    "Alert",
    "AlertRules",
    "ClusterState",
    "ClusterTotals",
    "Finding",
    "Level",
    "OpTotals",
    "RankState",
    "RankTotals",
    "Standing",
    "StepAggregate",
    "StepSummary",
    "bandwidth",
    "units",
]
