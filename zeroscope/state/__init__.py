"""ClusterState: the pure-Python model of a job that every view reads (no Textual here)."""

from . import units
from .alerts import Alert, AlertRules
from .cluster import ClusterState, StepAggregate
from .rank import OpTotals, RankState, StepSummary

__all__ = [
    "Alert",
    "AlertRules",
    "ClusterState",
    "OpTotals",
    "RankState",
    "StepAggregate",
    "StepSummary",
    "units",
]
