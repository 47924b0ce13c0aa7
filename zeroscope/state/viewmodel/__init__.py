"""The view-model API: everything zeroscope/tui and zeroscope/commands may take from state.

Each screen and report has one function here that returns its values *and their judgement*
(a :data:`Level` from :class:`AlertRules`, the one place thresholds live): the views map a level
to a colour or a word and format the numbers, nothing else. The import contracts
(pyproject.toml, ``views-read-the-view-model``) let tui/ and commands/ import from state only
this package and ``zeroscope.state.units``; the modules that compute stay behind it.

| screen or report | function |
|---|---|
| cluster (header, charts, alerts) | ``cluster_view``, ``header_facts``, ``evaluate`` via ClusterState.alerts |
| rank table and heatmap | ``rank_rows``, ``heat_view`` |
| rank detail | ``rank_comm_view`` |
| memory | ``memory_view`` |
| communication | ``comm_view`` |
| pipeline | ``pipeline_view`` (rows carry their bubble level) |
| loss scale | ``loss_scale_view`` |
| advice | ``advise``, ``preflight``, ``price_words`` |
| headless lines | ``step_line``, ``summary_lines`` |
| summary and export | ``run_report``, ``collective_figures``, ``parallel_fields`` |
| estimate | ``stage_estimates`` |
"""

from __future__ import annotations

from zeroscope.state.advice import Advisory, advise, preflight
from zeroscope.state.advice.model import ms, nbytes
from zeroscope.state.alerts import HEAT_METRICS, Alert, AlertRules, Level
from zeroscope.state.cluster import ClusterState
from zeroscope.state.estimate import stage_estimates
from zeroscope.state.history import (
    StepPoint,
    StepSeries,
    busbw_series,
    rank_beside_cluster,
    skipped_steps,
    stacked_parts,
    volume_series,
)
from zeroscope.state.lines import step_line, summary_lines
from zeroscope.state.mesh import PipelineRun, mesh_shape, parallel_fields, role
from zeroscope.state.pipeline import Act, PipelineView, layout_of, pipeline_view
from zeroscope.state.prediction import (
    deviation,
    paper_differences,
    predicted_memory,
    predicted_traffic,
)
from zeroscope.state.rank import RankState
from zeroscope.state.report import collective_figures, run_report
from zeroscope.state.roster import MissingGroup, headcount

__all__ = [
    "HEAT_METRICS",
    "Act",
    "Advisory",
    "Alert",
    "AlertRules",
    "ClusterState",
    "Level",
    "MissingGroup",
    "PipelineRun",
    "PipelineView",
    "RankState",
    "StepPoint",
    "StepSeries",
    "advise",
    "busbw_series",
    "collective_figures",
    "deviation",
    "headcount",
    "layout_of",
    "mesh_shape",
    "ms",
    "nbytes",
    "paper_differences",
    "parallel_fields",
    "pipeline_view",
    "predicted_memory",
    "predicted_traffic",
    "preflight",
    "rank_beside_cluster",
    "role",
    "run_report",
    "skipped_steps",
    "stacked_parts",
    "stage_estimates",
    "step_line",
    "summary_lines",
    "volume_series",
]
