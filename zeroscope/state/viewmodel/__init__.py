"""The view-model API: everything zeroscope/tui and zeroscope/commands may take from state.

Each screen and report has one function here that returns its values *and their judgement*
(a :data:`Level` from :class:`AlertRules`, the one place thresholds live): the views map a level
to a colour or a word and format the numbers, nothing else. The import contracts
(pyproject.toml, ``views-read-the-view-model``) let tui/ and commands/ import from state only
this package and ``zeroscope.state.units``; the modules that compute stay behind it.

| screen or report | function |
|---|---|
| cluster (header, charts, alerts) | ``ClusterState.alerts``, ``headcount``, ``mesh_shape``, ``header_throughput``, ``StepSeries`` |
| rank table and heatmap | ``rank_rows`` (slowness judged, each row's ``throughput``), ``heat_view`` (bands) |
| node table (large jobs) | ``NodeView`` (rows made for the nodes on screen; the slowest rank's slowness and the exposed share judged), ``node_rows``, ``node_ranks`` (drill-down) |
| rank detail | ``rank_comm_view`` (exposed share judged), ``rank_beside_cluster``, ``rank_throughput`` |
| history plots | ``StepSeries`` (the cluster's MFU and tokens/s per step), ``summary_mfu``, ``summary_tokens_per_s`` |
| memory | ``memory_view`` (each part's deviation judged) |
| communication | ``comm_view`` (traffic ratio and exposed share judged) |
| pipeline | ``judged_pipeline`` (each stage's bubble judged against its plan) |
| loss scale | ``loss_scale_view`` (log2 axis, skipped steps, events judged) |
| advice (screen and ``advise``) | ``advise``, ``preflight``, ``price_words`` |
| headless lines (``run``, ``replay``) | ``step_line``, ``step_lines``, ``summary_lines`` |
| ``summary`` and ``export`` | ``run_report``, ``collective_figures``, ``parallel_fields`` |
| ``estimate`` | ``stage_estimates`` |
"""

from __future__ import annotations

from zeroscope.state.advice import Advisory, advise, preflight
from zeroscope.state.advice.model import ms, nbytes
from zeroscope.state.alerts import HEAT_METRICS, Alert, AlertRules, Level
from zeroscope.state.clock import receive_now
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
from zeroscope.state.lines import (
    THINNED_FIGURES,
    header_throughput,
    step_line,
    step_lines,
    summary_lines,
    throughput_line,
)
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

from .comm import CommView, RankCommView, comm_view, rank_comm_view
from .memory import MemoryRow, MemoryView, PartCell, memory_view
from .nodes import NodeKey, NodeRow, NodeView, node_name, node_ranks, node_rows
from .ranks import HeatView, RankRow, heat_value, heat_view, rank_rows
from .screens import (
    EVENT_LEVELS,
    LossScaleView,
    judged_pipeline,
    loss_scale_view,
    price_words,
)
from .throughput import Throughput, rank_throughput, summary_mfu, summary_tokens_per_s

__all__ = [
    "EVENT_LEVELS",
    "HEAT_METRICS",
    "THINNED_FIGURES",
    "Act",
    "Advisory",
    "Alert",
    "AlertRules",
    "ClusterState",
    "CommView",
    "HeatView",
    "Level",
    "LossScaleView",
    "MemoryRow",
    "MemoryView",
    "MissingGroup",
    "NodeKey",
    "NodeRow",
    "NodeView",
    "PartCell",
    "PipelineRun",
    "PipelineView",
    "RankCommView",
    "RankRow",
    "RankState",
    "StepPoint",
    "StepSeries",
    "Throughput",
    "advise",
    "busbw_series",
    "collective_figures",
    "comm_view",
    "deviation",
    "headcount",
    "header_throughput",
    "heat_value",
    "heat_view",
    "judged_pipeline",
    "layout_of",
    "loss_scale_view",
    "memory_view",
    "mesh_shape",
    "ms",
    "nbytes",
    "node_name",
    "node_ranks",
    "node_rows",
    "paper_differences",
    "parallel_fields",
    "pipeline_view",
    "predicted_memory",
    "predicted_traffic",
    "preflight",
    "price_words",
    "rank_beside_cluster",
    "rank_comm_view",
    "rank_rows",
    "rank_throughput",
    "receive_now",
    "role",
    "run_report",
    "skipped_steps",
    "stacked_parts",
    "stage_estimates",
    "step_line",
    "step_lines",
    "summary_lines",
    "summary_mfu",
    "summary_tokens_per_s",
    "throughput_line",
    "volume_series",
]
