"""Bounded storage for big jobs: the trace keeps full detail for recent steps and for steps an
alert touched, and thins the history beyond (every ``every``-th step, plus per-node aggregates
of every step).

Why: a StepReport costs 0.6-3 KB in the trace (a CPU job's to a GPU job's with its
collectives and phase spans). 16,384 ranks at 1 step/s make 59 M of them an hour, 35-180 GB;
an hour's trace must stay near 2 GB, 34 bytes a rank-step. So, once a job has
``from_ranks`` ranks (a Hello's ``world_size``; smaller jobs keep everything, as before):

- every message of the last ``recent`` steps is kept as it came;
- a step that leaves that window keeps its StepReports and Heartbeats only when ``step %
  every == 0``, it is the first step, or an alert touched it: an Event or a report with an
  overflow or a skipped step at that step, or a rank newly over the straggler rule's limit
  (its compute, step time less its exposed wait, above the step's median compute by
  ``AlertRules.straggler_limit_s`` of the median step time, where it was not at the step
  before). Alert-kept steps are at least ``every // 16`` steps apart, so a flapping rank cannot
  undo the bound. A kept step keeps every rank, so a replayed step is whole;
- Events, Byes, Hellos and the collector's records are never thinned;
- every step, thinned or kept, leaves one row per node in ``node_steps`` (WITHOUT ROWID,
  keyed by (step, node)): how many ranks reported, the fastest, mean and slowest step time and
  the slowest rank, the latest step end, the largest P+G+O+A, the largest exposed wait, the
  collective bytes and the samples. Replay and ``summary`` read the run's pace from them.

Where: the thinning runs in the trace's writer (TraceWriter.commit, after the batch is
inserted), on the rows already written, a few steps per commit; ingest only notes each report's
figures in :class:`StepBook` (a handful of attribute reads on the message the collector has
already decoded). The trace's ``meta`` says what was done: ``thinning`` (the policy, JSON) and
``thinned_before`` (every step below it is thinned), so every reader can say "thinned: every
256th step before step S".
"""

from __future__ import annotations

import json
import sqlite3
import statistics
from dataclasses import asdict, dataclass, field

import msgspec

from zeroscope.agent import schema
from zeroscope.agent.schema import BatchEntry, Message, NodeStep
from zeroscope.state import node_steps
from zeroscope.state.alerts import AlertRules


@dataclass(frozen=True, slots=True)
class ThinningPolicy:
    """What the trace keeps of a big job (see module doc)."""

    every: int = 256
    """Beyond the recent window, one step in this many keeps its reports."""
    recent: int = 32
    """The newest steps kept in full."""
    from_ranks: int = 1024
    """Jobs with fewer ranks (the largest Hello ``world_size``) are never thinned."""

    @property
    def alert_gap(self) -> int:
        """Steps kept for an alert are at least this far apart."""
        return max(1, self.every // 16)

    def keeps(self, step: int, first_step: int) -> bool:
        """Whether ``step`` keeps its reports by the schedule alone (alerts aside)."""
        return step % self.every == 0 or step == first_step

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ThinningPolicy:
        fields = json.loads(text)
        return cls(
            every=int(fields["every"]),
            recent=int(fields["recent"]),
            from_ranks=int(fields["from_ranks"]),
        )


def thinned_note(policy: ThinningPolicy, before_step: int) -> str:
    """The one sentence every reader shows for a thinned trace."""
    return (
        f"thinned: every {_ordinal(policy.every)} step (and steps an alert touched) before step "
        f"{before_step}, plus per-node aggregates of every step; full detail from step "
        f"{before_step}"
    )


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


NODE_STEPS = """
CREATE TABLE IF NOT EXISTS node_steps(
    step INTEGER NOT NULL,
    node INTEGER NOT NULL,
    ranks INTEGER NOT NULL,
    step_s_min REAL, step_s_mean REAL, step_s_max REAL, slowest_rank INTEGER,
    wall_ns_max INTEGER, memory_max INTEGER, exposed_s_max REAL,
    comm_bytes INTEGER, samples INTEGER,
    PRIMARY KEY(step, node)
) WITHOUT ROWID;
"""


@dataclass(slots=True)
class _Step:
    nodes: dict[int, NodeStep] = field(default_factory=dict)
    compute: dict[int, float] = field(default_factory=dict)
    durations: list[float] = field(default_factory=list)
    alerted: bool = False


class StepBook:
    """The figures of the steps still in the recent window, noted as messages are written, and
    the decision for each step that leaves it."""

    def __init__(self, policy: ThinningPolicy, rules: AlertRules | None = None) -> None:
        self.policy = policy
        self.rules = rules or AlertRules()
        self.world = 0
        self.node_of: dict[int, int] = {}
        self.steps: dict[int, _Step] = {}
        self.first_step: int | None = None
        self.last_step: int | None = None
        self.thinned_before: int | None = None
        """Every step below this has been thinned (None: nothing yet)."""
        self._over: set[int] = set()
        self._last_alert_kept: int | None = None
        self.kept_for_alerts: list[int] = []
        self.late_dropped = 0
        """Reports of an already thinned step that arrived late and were not written."""

    @property
    def active(self) -> bool:
        return self.world >= self.policy.from_ranks

    def note(self, message: Message) -> bool:
        """Fold one message in; False when it is not to be written (a late report of a step
        already thinned that the schedule does not keep)."""
        if isinstance(message, schema.Hello):
            self.world = max(self.world, message.world_size)
            self.node_of[message.rank] = message.node_rank
            return True
        if not isinstance(message, (schema.StepReport, schema.Event, schema.Heartbeat)):
            return True
        step = message.step
        if self._thinned(step):
            if isinstance(message, schema.Event):
                return True
            return self._late(step)
        book = self._book(step)
        if isinstance(message, schema.Event):
            book.alerted = True
        elif isinstance(message, schema.StepReport):
            self._report(book, message)
        return True

    def note_batch(self, entries: list[BatchEntry], nodes: list[NodeStep]) -> list[bool]:
        """A node relay's batch of StepReports (agent/node_batch.py), folded from its header
        without decoding a report: the node aggregates merge in as the relay made them, the
        entries give each rank's compute for the straggler judgement. Returns, per entry,
        whether it is to be written (as :meth:`note`)."""
        keep = []
        for e in entries:
            if self._thinned(e.step):
                keep.append(self._late(e.step))
                continue
            book = self._book(e.step)
            book.alerted = book.alerted or e.alerted
            book.compute[e.rank] = e.duration_s - e.exposed_s
            book.durations.append(e.duration_s)
            keep.append(True)
        for agg in nodes:
            if self._thinned(agg.step):
                continue  # its reports came late too: the step's rows are written
            book = self._book(agg.step)
            held = book.nodes.get(agg.node_rank)
            if held is None:
                book.nodes[agg.node_rank] = msgspec.structs.replace(agg)  # a copy to merge into
            else:
                node_steps.merge(held, agg)
        return keep

    def _thinned(self, step: int) -> bool:
        return self.thinned_before is not None and step < self.thinned_before

    def _late(self, step: int) -> bool:
        """A report of a step already thinned: written only when the schedule keeps it."""
        first = self.first_step if self.first_step is not None else step
        keep = self.policy.keeps(step, first)
        self.late_dropped += not keep
        return keep

    def _book(self, step: int) -> _Step:
        book = self.steps.get(step)
        if book is None:
            book = self.steps[step] = _Step()
            if self.first_step is None or step < self.first_step:
                self.first_step = step
            if self.last_step is None or step > self.last_step:
                self.last_step = step
        return book

    def _report(self, book: _Step, r: schema.StepReport) -> None:
        if r.overflow or r.skipped:
            book.alerted = True
        node_rank = self.node_of.get(r.rank, -1)
        held = book.nodes.get(node_rank)
        figures = node_steps.figures(r)
        agg = node_steps.add_report(held, node_rank, r, figures)
        if held is None:
            book.nodes[node_rank] = agg
        exposed = figures[0]
        book.compute[r.rank] = r.duration_s - exposed
        book.durations.append(r.duration_s)

    def due(self) -> list[int]:
        """Steps that left the recent window, oldest first."""
        if not self.active or self.last_step is None:
            return []
        edge = self.last_step - self.policy.recent
        return sorted(s for s in self.steps if s <= edge)

    def decide(self, step: int) -> tuple[bool, list[tuple[float, ...]]]:
        """(keep the step's reports, its node_steps rows); forgets the step."""
        book = self.steps.pop(step)
        over = self._over_ranks(book)
        onset = bool(over - self._over)
        self._over = over
        first = self.first_step if self.first_step is not None else step
        keep = self.policy.keeps(step, first)
        if not keep and (book.alerted or onset):
            last = self._last_alert_kept
            if last is None or step - last >= self.policy.alert_gap:
                keep = True
                self._last_alert_kept = step
                self.kept_for_alerts.append(step)
        self.thinned_before = max(self.thinned_before or 0, step + 1)
        rows = [node_steps.row(n) for _, n in sorted(book.nodes.items())]
        return keep, rows

    def _over_ranks(self, book: _Step) -> set[int]:
        if len(book.compute) < 2:
            return set()
        median_compute = statistics.median(book.compute.values())
        limit = self.rules.straggler_limit_s(statistics.median(book.durations))
        return {r for r, c in book.compute.items() if c - median_compute > limit}


def thin(conn: sqlite3.Connection, book: StepBook, *, most: int = 4) -> int:
    """Thin at most ``most`` steps that left the window (inside the caller's transaction);
    returns how many were done."""
    done = 0
    for step in book.due()[:most]:
        keep, rows = book.decide(step)
        if not keep:
            conn.execute(
                "DELETE FROM messages WHERE step = ? AND kind IN ('step', 'heartbeat')", (step,)
            )
        conn.executemany(
            "INSERT OR REPLACE INTO node_steps VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows
        )
        done += 1
    return done
