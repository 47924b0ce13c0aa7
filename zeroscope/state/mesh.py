"""A 3D-parallel job as the viewer groups it: each rank's mesh coordinates and role, the job's
mesh shape, and every rank's pipeline figures over a whole run (``summary --json``). The
per-step pipeline figures and timelines are in :mod:`.pipeline`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from zeroscope.agent.schema import Hello, StepReport

from .pipeline import bubble_fraction, layout_of, tp_comm_s

# -- per rank over a whole run (summary) -----------------------------------------------------


class PipelineRun:
    """Every rank's pipeline figures over a run, for ``summary --json``: per-step means of
    compute, P2P wait and tensor-parallel comm, and the bubble fraction over the replica's
    spans. Each rank's first pipeline step (shape inference and P2P warm-up run inside it) is
    left out once the rank has later ones."""

    def __init__(self, hellos: Iterable[Hello]) -> None:
        self.layouts = {h.rank: h.parallel for h in hellos if h.parallel is not None}
        self._sums: dict[int, list[float]] = {}  # rank -> [steps, compute, p2p, tp]
        self._first: dict[int, tuple[int, float, float, float, float]] = {}
        self._steps: dict[int, tuple[int, int]] = {}  # rank -> (first, last) step counted
        self._span: dict[tuple[int, int, int], float] = {}  # (step, dp, tp) -> span

    def add(self, report: StepReport) -> None:
        layout = self.layouts.get(report.rank)
        p = report.pipeline
        if p is None or layout is None:
            return
        key = (report.step, layout.dp, layout.tp)
        self._span[key] = max(self._span.get(key, 0.0), p.step_s)
        figures = (sum(a.duration_s for a in p.actions), p.p2p_wait_s, tp_comm_s(report))
        if report.rank not in self._first:
            self._first[report.rank] = (report.step, *figures, p.step_s)
            return
        sums = self._sums.setdefault(report.rank, [0.0, 0.0, 0.0, 0.0])
        sums[0] += 1
        for i, value in enumerate(figures, start=1):
            sums[i] += value
        first, _ = self._steps.get(report.rank, (report.step, report.step))
        self._steps[report.rank] = (min(first, report.step), max(first, report.step))

    def rank(self, rank: int) -> dict[str, Any] | None:
        layout = self.layouts.get(rank)
        if layout is None or not layout.schedule or rank not in self._first:
            return None
        if rank in self._sums:
            steps, compute, p2p, tp = self._sums[rank]
            lo, hi = self._steps[rank]
            span = sum(
                v
                for (step, dp, tp_), v in self._span.items()
                if lo <= step <= hi and dp == layout.dp and tp_ == layout.tp
            )
        else:
            step, compute, p2p, tp, own = self._first[rank]
            steps = 1
            span = self._span.get((step, layout.dp, layout.tp), own)
        return {
            "stage": layout.pp,
            "compute_s": compute / steps,
            "p2p_wait_s": p2p / steps,
            "bubble_fraction": bubble_fraction(span, compute),
            "tp_comm_s": tp / steps,
            "steps": int(steps),
        }


def mesh_dict(hello: Hello | None, rank: int) -> dict[str, int]:
    """A rank's mesh coordinates; a plain data-parallel job is the mesh dp=world."""
    layout = layout_of(hello)
    if layout is None:
        return {"dp": rank, "pp": 0, "tp": 0}
    return {"dp": layout.dp, "pp": layout.pp, "tp": layout.tp}


def mesh_shape(hellos: Iterable[Hello | None]) -> str | None:
    """``pp2 × dp2 × tp2`` (with the schedule) when the job reported a 3D layout."""
    for hello in hellos:
        layout = layout_of(hello)
        if layout is not None:
            shape = f"pp{layout.pp_size}×dp{layout.dp_size}×tp{layout.tp_size}"
            if layout.schedule:
                shape += f" {layout.schedule.removeprefix('Schedule')} m={layout.microbatches}"
            return shape
    return None


def role(hello: Hello | None) -> str | None:
    """``stage 1/2 · tp 0/2 · dp 1/2`` for a rank of a 3D-parallel job."""
    layout = layout_of(hello)
    if layout is None:
        return None
    stages = ",".join(str(s) for s in layout.stages) if len(layout.stages) > 1 else None
    stage = f"stage {layout.pp}/{layout.pp_size}" + (f" (chunks {stages})" if stages else "")
    return f"{stage} · tp {layout.tp}/{layout.tp_size} · dp {layout.dp}/{layout.dp_size}"


def parallel_fields(hello: Hello | None, rank: int, run: PipelineRun) -> dict[str, Any]:
    """``summary --json``'s per-rank ``mesh`` and ``pipeline`` (None without a pipeline)."""
    return {"mesh": mesh_dict(hello, rank), "pipeline": run.rank(rank)}
