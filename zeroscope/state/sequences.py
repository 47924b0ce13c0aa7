"""Ranks whose collective sequences diverge: the step, the ranks and the first collective that
differs, found when a step closes and before any hang it leads to.

Every rank of a data-parallel group must issue the same collectives in the same order (ops,
sizes; the engine's labels name the parameters too): the ranks of one pipeline stage and tensor
slice (Hello.parallel), every rank in plain data parallelism. Data-dependent control flow (a branch that
skips or reorders a module on one rank, uneven batches) breaks that: when sizes differ the job
hangs or fails in a collective; when they happen to agree it silently mixes up data. Each
StepSummary carries a fingerprint of its sequence (zeroscope.state.rank.fingerprint); a closed
step whose ranks disagree is recorded here with the first differing position, read off the
ranks' newest full reports when those are of that step.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zeroscope.agent.schema import Collective

    from .cluster import StepAggregate
    from .rank import RankState

_SEQUENCE = attrgetter("sequence")


@dataclass(frozen=True, slots=True)
class Divergence:
    """One step whose ranks issued different collective sequences."""

    step: int
    ranks: tuple[int, ...]
    """The ranks off the reference sequence."""
    reference: tuple[int, ...]
    """The ranks sharing the reference (the most common one; ties: the lowest rank's)."""
    detail: str
    """The first differing collective, or why it is not known."""


def _describe(c: Collective | None) -> str:
    if c is None:
        return "nothing (its sequence ended)"
    return f"{c.op} of {c.nbytes} B" + (f" '{c.label}'" if c.label else "")


def peers(rank: RankState | None) -> tuple[int, int]:
    """Which ranks must issue this rank's sequence: those of its pipeline stage and tensor
    slice (its data-parallel replicas). Stages of a pipeline send and receive different
    messages by design (stage 0 sends activations forward, stage 1 receives them), and tensor
    slices may differ too; plain data parallelism is one group."""
    layout = rank.hello.parallel if rank is not None and rank.hello is not None else None
    return (0, 0) if layout is None else (layout.pp, layout.tp)


def first_difference(mine: list[Collective], theirs: list[Collective]) -> tuple[int, str] | None:
    """(index, text) of the first collective where two sequences differ; None if equal."""
    for i in range(max(len(mine), len(theirs))):
        a = mine[i] if i < len(mine) else None
        b = theirs[i] if i < len(theirs) else None
        if a is None or b is None or (a.op, a.nbytes, a.label) != (b.op, b.nbytes, b.label):
            return i, f"collective #{i + 1}: {_describe(a)} where the others issued {_describe(b)}"
    return None


class SequenceBook:
    """Divergent steps as they close (the first ones and the latest are kept)."""

    KEEP = 16

    def __init__(self) -> None:
        self.divergences: list[Divergence] = []
        self.count = 0
        """Divergent steps seen in all."""

    def add(self, agg: StepAggregate, ranks: dict[int, RankState], staged: bool = True) -> None:
        """``staged``: some rank runs a pipeline stage or tensor slice (else one group, no
        per-rank lookup: the 16,384-rank close stays as cheap as it was)."""
        if not staged:
            distinct = set(map(_SEQUENCE, agg.summaries.values()))
            distinct.discard(0)
            if len(distinct) <= 1:
                return  # one group, every rank's alike: a C-level pass (~2 ms at 16,384 ranks)
        groups: dict[tuple[int, int], dict[int, int]] = {}
        for r, s in agg.summaries.items():
            if s.sequence:
                groups.setdefault(peers(ranks.get(r)) if staged else (0, 0), {})[r] = s.sequence
        for prints in groups.values():
            if len(set(prints.values())) > 1:
                self._diverged(agg, prints, ranks)
                return  # one record a step: the first group off its reference

    def _diverged(
        self, agg: StepAggregate, prints: dict[int, int], ranks: dict[int, RankState]
    ) -> None:
        tally = Counter(prints.values())
        best = max(tally.values())
        lowest = {v: min(r for r, p in prints.items() if p == v) for v in tally}
        ref = min((v for v, n in tally.items() if n == best), key=lambda v: lowest[v])
        odd = tuple(sorted(r for r, p in prints.items() if p != ref))
        same = tuple(sorted(r for r, p in prints.items() if p == ref))
        self.count += 1
        record = Divergence(agg.step, odd, same, self._detail(agg.step, odd[0], same[0], ranks))
        if len(self.divergences) >= self.KEEP:
            self.divergences.pop(self.KEEP // 2)  # keep the first half and the newest
        self.divergences.append(record)

    @staticmethod
    def _detail(step: int, odd: int, ref: int, ranks: dict[int, RankState]) -> str:
        a, b = ranks[odd].latest, ranks[ref].latest
        if a is None or b is None or a.step != step or b.step != step:
            return f"rank {odd}'s step-{step} collectives are no longer held (only a fingerprint)"
        found = first_difference(a.collectives, b.collectives)
        if found is None:
            return "the sequences differ only in collectives left unfinished"
        return f"rank {odd} {found[1]} (rank {ref})"
