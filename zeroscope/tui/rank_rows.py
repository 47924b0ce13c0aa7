"""Rows of the rank table and the heatmap: one flat record per rank, sorted and filtered.

Pure Python over ClusterState (no Textual), computed once per state change and shared by the
table and the heatmap, so a 1024-rank frame sorts once and draws only the visible rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from zeroscope.state import ClusterState, Level
from zeroscope.state.pipeline import layout_of
from zeroscope.state.throughput import rank_step

SORT_KEYS = ("rank", "memory", "step", "slowness", "exposed", "offload", "mesh")
"""``mesh`` (pp, dp, tp) is offered only for jobs that report a 3D layout."""


@dataclass(slots=True)
class RankRow:
    rank: int
    host: str
    params: int | None
    grads: int | None
    optim: int | None
    activations: int | None
    total: int | None
    step: int | None
    step_time: float | None
    slowness: float | None
    slowness_level: Level
    exposed: float | None
    offload_bw: float | None
    loss_scale: float | None
    flag: str
    """"" or a short word: raised, killed, died, exited, silent, mem!, slow, comm, drops."""
    mesh: tuple[int, int, int] | None = None
    """(pp, dp, tp) of a 3D-parallel job's rank: the table groups by stage, then replica."""
    mfu: float | None = None
    """The rank's MFU in its newest step (zeroscope.state.throughput) [fraction]."""
    reports_work: bool = False
    """Whether the rank reports its tokens and FLOPs at all (the MFU column shows if any does)."""


def rank_rows(state: ClusterState, flagged: dict[int, str] | None = None) -> list[RankRow]:
    rows = []
    flagged = flagged or {}
    for r, rs in state.ranks.items():
        s = rs.summary
        layout = layout_of(rs.hello)
        slowness = state.slowness(r)
        rows.append(
            RankRow(
                rank=r,
                host=rs.hostname,
                params=s.params if s else None,
                grads=s.grads if s else None,
                optim=s.optim if s else None,
                activations=s.activations if s else None,
                total=s.device_total if s else None,
                step=s.step if s else None,
                step_time=s.duration_s if s else None,
                slowness=slowness,
                slowness_level=state.rules.slowness_level(slowness),
                exposed=s.exposed_share if s else None,
                offload_bw=s.offload_bw if s else None,
                loss_scale=s.loss_scale if s else None,
                flag=flagged.get(r, ""),
                mesh=None if layout is None else (layout.pp, layout.dp, layout.tp),
                mfu=rank_step(s).mfu if s is not None and s.work is not None else None,
                reports_work=s is not None and s.work is not None,
            )
        )
    return rows


FLAG_WORDS = {
    # Most telling first: how a rank ended outranks how it was doing (a rank that raised had
    # its comm exposed too, but "comm" would hide why it stopped).
    "raised": "raised",  # the job's first failure: its own exception (zeroscope.run.job)
    "killed": "killed",  # a signal: torchrun stopping it after another rank failed, or SIGKILL
    "lost": "died",
    "exited": "exited",
    "silent": "silent",
    "memory": "mem!",
    "straggler": "slow",
    "exposed_comm": "comm",
    "drops": "drops",
}
_RANKING = {kind: i for i, kind in enumerate(FLAG_WORDS)}


def flags_from_alerts(state: ClusterState, alerts: list) -> dict[int, str]:
    """Rank -> the word its most telling alert puts in the table's last column."""
    best: dict[int, int] = {}
    for alert in alerts:
        rank_of_kind = _RANKING.get(alert.kind)
        if rank_of_kind is None:
            continue
        for r in alert.ranks:
            if rank_of_kind < best.get(r, len(_RANKING)):
                best[r] = rank_of_kind
    words = list(FLAG_WORDS.values())
    return {r: words[i] for r, i in best.items()}


def sort_rows(rows: list[RankRow], key: str, descending: bool) -> list[RankRow]:
    """Missing figures (NA) sort last whichever way."""
    if key == "rank":
        return sorted(rows, key=lambda row: row.rank, reverse=descending)
    if key == "mesh":
        return sorted(rows, key=lambda row: (row.mesh or (0, 0, 0), row.rank), reverse=descending)
    attr = {
        "memory": "total",
        "step": "step_time",
        "slowness": "slowness",
        "exposed": "exposed",
        "offload": "offload_bw",
    }[key]
    known = [row for row in rows if getattr(row, attr) is not None]
    missing = [row for row in rows if getattr(row, attr) is None]
    known.sort(key=lambda row: (getattr(row, attr), -row.rank), reverse=descending)
    return known + sorted(missing, key=lambda row: row.rank)


def filtered(rows: list[RankRow], query: str) -> list[RankRow]:
    return [row for row in rows if matches(row, query)] if query.strip() else list(rows)


def matches(row: RankRow, query: str) -> bool:
    """A filter: ranks ``3``/``r3``, ranges ``0-7``, a host substring, or a flag word (slow,
    silent ...); several terms separated by spaces or commas match any of them."""
    terms = [t for t in query.replace(",", " ").split() if t]
    if not terms:
        return True
    for term in terms:
        t = term.lower().removeprefix("r") if term[1:].isdigit() else term.lower()
        if t.isdigit() and row.rank == int(t):
            return True
        if "-" in t:
            lo, _, hi = t.partition("-")
            if lo.isdigit() and hi.isdigit() and int(lo) <= row.rank <= int(hi):
                return True
        if t and (t in row.host.lower() or (row.flag and t in row.flag)):
            return True
    return False
