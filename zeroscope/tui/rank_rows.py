"""The rank table's and heatmap's rows sorted and filtered (the rows and their judgements are
state's view-model, zeroscope.state.viewmodel.rank_rows), and the flag word each rank's most
telling alert puts in the table."""

from __future__ import annotations

from zeroscope.state.viewmodel import ClusterState, RankRow

SORT_KEYS = ("rank", "memory", "step", "slowness", "exposed", "offload", "mesh")
"""``mesh`` (pp, dp, tp) is offered only for jobs that report a 3D layout."""


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
