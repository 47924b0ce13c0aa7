"""ClusterState: every rank's messages folded into one model of the job. Pure Python, no Textual.

The TUI, the headless lines, replay and the tests all read this one model. Views align ranks by
*step*, never by wall clock (ranks' clocks may disagree); the only clock is the receive time
the caller passes to :meth:`ClusterState.ingest` (live: ``time.time()``; replay and tests: the
message's own ``wall_ns``), used for "rank silent" alerts.
"""

from __future__ import annotations

import statistics
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from zeroscope.agent.schema import (
    Bye,
    ConfigSummary,
    Event,
    Heartbeat,
    Hello,
    Message,
    ParamCounts,
    StepReport,
)

from .alerts import Alert, AlertRules, evaluate
from .rank import HISTORY_STEPS, RankState, StepSummary


@dataclass(slots=True)
class StepAggregate:
    """One optimizer step across the ranks that reported it."""

    step: int
    summaries: dict[int, StepSummary] = field(default_factory=dict)
    samples: int = 0
    skipped: bool = False
    complete: bool = False

    @property
    def wall_ns(self) -> int:
        return max(s.wall_ns for s in self.summaries.values())

    @property
    def step_time(self) -> float:
        """The step takes as long as its slowest rank (they meet at the next collective)."""
        return max(s.duration_s for s in self.summaries.values())

    _median: float | None = None

    @property
    def median_time(self) -> float:
        """Cached: every rank's slowness divides by it (1024 ranks x 1024 would be 10^6)."""
        if self._median is None:
            self._median = statistics.median(s.duration_s for s in self.summaries.values())
        return self._median

    @property
    def slowest_rank(self) -> int:
        return max(self.summaries, key=lambda r: (self.summaries[r].duration_s, -r))

    @property
    def worst_memory_rank(self) -> int:
        return max(self.summaries, key=lambda r: (self.summaries[r].device_total, -r))

    @property
    def loss(self) -> float | None:
        """Rank 0's loss when it reported (what the training script prints), else the lowest
        rank's."""
        for rank in sorted(self.summaries):
            if self.summaries[rank].loss is not None:
                return self.summaries[rank].loss
        return None

    @property
    def loss_scale(self) -> float | None:
        return next((s.loss_scale for s in self.summaries.values() if s.loss_scale), None)

    @property
    def overflow(self) -> bool:
        return any(s.overflow for s in self.summaries.values())

    @property
    def exposed_share(self) -> float | None:
        """The worst rank's exposed communication share of its step."""
        shares = [s.exposed_share for s in self.summaries.values() if s.exposed_share is not None]
        return max(shares) if shares else None


class ClusterState:
    """Per-rank latest + history, per-step aggregates, events, alerts."""

    def __init__(
        self, *, history_steps: int = HISTORY_STEPS, rules: AlertRules | None = None
    ) -> None:
        self.rules = rules or AlertRules()
        self.history_steps = history_steps
        self.ranks: dict[int, RankState] = {}
        self.steps: OrderedDict[int, StepAggregate] = OrderedDict()
        self.events: deque[Event] = deque(maxlen=2000)
        self.job_id = ""
        self.world_size = 0
        self.config: ConfigSummary | None = None
        self.params: ParamCounts | None = None
        self.device = ""
        self.engine = ""
        """What the ranks run on (Hello.engine): ``zeroscope`` (the bundled engine), or the
        engine the attach found (``deepspeed``, ``fsdp2``, ``ddp``, ``hf-trainer+...``)."""
        self.clock_s = 0.0
        self.messages = 0
        self.version = 0
        """Bumped on every change: a view redraws only when it moved."""
        self.last_complete: int | None = None
        self.recording_error = ""
        """Set by the collector's owner when the trace stopped recording (an alert)."""
        self.steps_completed = 0
        """Steps closed since the start (``steps`` keeps only the last ``history_steps``)."""
        """Set by the collector's owner when the trace stopped recording (an alert)."""

    # ----------------------------------------------------------------- ingest
    def rank(self, rank: int) -> RankState:
        state = self.ranks.get(rank)
        if state is None:
            state = self.ranks[rank] = RankState(rank)
        return state

    def ingest(self, message: Message, received_s: float | None = None) -> list[StepAggregate]:
        """Fold one message in; returns the steps it completed (oldest first)."""
        if received_s is None:
            # Replay: no receiver clock. Ranks' clocks can be far apart, so a message arrives
            # at the newest instant seen so far, never earlier on its own rank's clock (a rank
            # whose clock runs an hour behind is not silent for an hour).
            wall = message.started_ns if isinstance(message, Hello) else message.wall_ns
            received_s = max(self.clock_s, wall / 1e9)
        self.clock_s = max(self.clock_s, received_s)
        self.messages += 1
        self.version += 1
        rank = self.rank(message.rank)
        rank.last_seen_s = max(rank.last_seen_s or 0.0, received_s)
        if isinstance(message, StepReport):
            return self._step(rank, message)
        if isinstance(message, Hello):
            rank.hello = message
            self.job_id = self.job_id or message.job_id
            self.world_size = max(self.world_size, message.world_size)
            self.config = self.config or message.config
            self.params = self.params or message.params
            self.device = self.device or message.device
            self.engine = message.engine or self.engine
        elif isinstance(message, Event):
            self.events.append(message)
        elif isinstance(message, Heartbeat):
            rank.dropped += message.dropped
        elif isinstance(message, Bye):
            rank.bye = message
        return []

    def ingest_all(self, messages: list[Message]) -> list[StepAggregate]:
        done: list[StepAggregate] = []
        for m in messages:
            done += self.ingest(m)
        return done

    def _step(self, rank: RankState, report: StepReport) -> list[StepAggregate]:
        if self.last_complete is not None and report.step <= self.last_complete:
            rank.record(report)  # a late report of a step already closed: history only
            return []
        agg = self.steps.get(report.step)
        if agg is None:
            agg = self.steps[report.step] = StepAggregate(report.step)
            while len(self.steps) > self.history_steps:
                self.steps.popitem(last=False)
        agg.summaries[report.rank] = rank.record(report)
        agg._median = None
        agg.samples += report.samples
        agg.skipped = agg.skipped or report.skipped
        if len(agg.summaries) >= (self.world_size or len(self.ranks)):
            return self._close_until(report.step)
        if len(agg.summaries) >= len(self.ranks):
            # Every rank this collector hears from (one node's share of a multi-node job has
            # fewer than world_size) is two steps past the older ones: close those. Two, not
            # one, so a rank whose first messages are merely late in transit is waited for.
            return self._close_until(report.step - 2)
        return []

    def _close_until(self, step: int) -> list[StepAggregate]:
        """Close ``step`` and every older open step (their missing reports were dropped)."""
        closed = []
        for s, agg in self.steps.items():
            if s > step:
                break
            if not agg.complete:
                agg.complete = True
                self.steps_completed += 1
                self._judge_stragglers(agg)
                closed.append(agg)
                self.last_complete = s
        return closed

    def flush(self) -> list[StepAggregate]:
        """The job ended: close the steps still waiting for reports that will never come."""
        return self._close_until(max(self.steps)) if self.steps else []

    def _judge_stragglers(self, agg: StepAggregate) -> None:
        """Median + k·MAD outlier test per step; a rank straggles after n outlier steps in a row."""
        times = [s.duration_s for s in agg.summaries.values()]
        if len(times) < 3:
            return
        median = statistics.median(times)
        mad = statistics.median(abs(t - median) for t in times)
        limit = max(median + self.rules.straggler_k * mad, median * (1 + self.rules.straggler_min))
        for r, s in agg.summaries.items():
            state = self.ranks[r]
            state.straggling_steps = state.straggling_steps + 1 if s.duration_s > limit else 0

    # ------------------------------------------------------------------ views
    def latest(self) -> StepAggregate | None:
        """The newest complete step (or the newest step at all before any completed)."""
        if self.last_complete is not None and self.last_complete in self.steps:
            return self.steps[self.last_complete]
        return next(reversed(self.steps.values()), None)

    def complete_steps(self) -> list[StepAggregate]:
        return [a for a in self.steps.values() if a.complete]

    def throughput(self, window: int = 10) -> tuple[float | None, float | None]:
        """(steps/s, samples/s) over the last ``window`` complete steps, from the ranks' own
        step-end instants (NA until two steps completed)."""
        done = self.complete_steps()[-window - 1 :]
        if len(done) < 2:
            return None, None
        span = (done[-1].wall_ns - done[0].wall_ns) / 1e9
        if span <= 0:
            return None, None
        samples = sum(a.samples for a in done[1:])
        return (len(done) - 1) / span, samples / span

    def slowness(self, rank: int) -> float | None:
        """This rank's latest step time relative to that step's median across ranks (1.0 =
        typical); NA until it reported."""
        state = self.ranks.get(rank)
        if state is None or state.summary is None:
            return None
        agg = self.steps.get(state.summary.step)
        if agg is None or not agg.summaries:
            return None
        median = agg.median_time
        return state.summary.duration_s / median if median > 0 else None

    def alerts(self, now_s: float | None = None) -> list[Alert]:
        return evaluate(self, self.clock_s if now_s is None else now_s)
