"""A node relay's batch of its ranks' StepReports, built on the node (agent/node_batch.py).

The relay decodes and validates each report its ranks send (one core of the node's many
shares the work the collector would otherwise do for every rank of the job), folds it into
its node's aggregate for its step (zeroscope.state.node_steps, the one definition), and makes
the report's summary, what every view needs of it (zeroscope.state.rank ``summarize``, the one
definition), sent inside the report (``StepReport.summary``, agent/schema_summary.py): at
16,384 ranks that summary was most of the viewer's cost per report, and here it is one node's
ranks' worth on one core of the node. The report goes on re-encoded with it, every other field
as the rank sent it. :meth:`NodeBatcher.take` hands out the ZeroMQ frames
``[header, body]`` the uplink sends behind ``[NODE_BATCH, token]``; the collector records and
publishes the reports from them without decoding one (collector/batch_ingest.py).

A batch holds what the relay's wake-up found (nothing waits to fill one), so a step's reports
may come in two batches: their aggregates merge at the collector.
"""

from __future__ import annotations

import msgspec

from zeroscope.agent import schema
from zeroscope.agent.schema import BatchEntry, NodeBatch, NodeStep, StepReport
from zeroscope.state import node_steps
from zeroscope.state.rank import summarize

MAX_REPORTS = 512
"""Reports per batch at most (the collector takes up to 2,000 messages per turn)."""

MAX_BYTES = 4 * 1024 * 1024
"""Body bytes per batch at most (the collector refuses a frame past 8 MiB)."""


class NodeBatcher:
    """The reports waiting to go, and their aggregates by (step, node)."""

    def __init__(self, node_rank: int, hostname: str) -> None:
        self.node_rank = node_rank
        self.hostname = hostname
        self.node_of: dict[int, int] = {}
        """Each rank's node as its Hello said (the relay's own until it did)."""
        self._entries: list[BatchEntry] = []
        self._payloads: list[bytes] = []
        self._size = 0
        self._nodes: dict[tuple[int, int], NodeStep] = {}
        self.unsummarized = 0
        """Reports sent on without a summary (:meth:`add`)."""

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def full(self) -> bool:
        return len(self._entries) >= MAX_REPORTS or self._size >= MAX_BYTES

    def hello(self, hello: schema.Hello) -> None:
        self.node_of[hello.rank] = hello.node_rank

    def add(self, report: StepReport, payload: bytes) -> None:
        """One rank's report (decoded from ``payload``), to go on with the summary every view
        needs of it made here, ours even if the sender put one in (module docstring). A report
        whose summary cannot be made or sent (sums past msgpack's 64-bit integers) goes on as
        the rank sent it, and the viewer folds it as a direct rank's: counted in
        ``unsummarized``."""
        try:
            summed = msgspec.structs.replace(report, summary=summarize(report))
            payload, report = schema.encode(summed), summed
        except Exception:
            self.unsummarized += 1
        node = self.node_of.get(report.rank, self.node_rank)
        its = node_steps.figures(report)
        self._entries.append(node_steps.entry(report, len(payload), node, its[0]))
        self._payloads.append(payload)
        self._size += len(payload)
        key = (report.step, node)
        held = self._nodes.get(key)
        agg = node_steps.add_report(held, node, report, its)
        if held is None:
            self._nodes[key] = agg

    def take(self) -> tuple[list[bytes], int]:
        """(the frames ``[header, body]``, how many reports they hold); empties the batcher.

        Raises :class:`UnsendableBatch`, with the batch's reports, when the header cannot be
        encoded: a node's sums past msgpack's 64-bit integers (two ranks'
        collectives of 2**63 bytes), which only a faulty sender reports. The caller sends
        those as plain messages: nothing is lost and the relay goes on."""
        payloads, n = self._payloads, len(self._entries)
        try:
            header = schema.encode_batch(
                NodeBatch(
                    version=schema.NODE_BATCH_VERSION,
                    node_rank=self.node_rank,
                    hostname=self.hostname,
                    entries=self._entries,
                    nodes=list(self._nodes.values()),
                )
            )
        except (OverflowError, msgspec.EncodeError) as exc:
            raise UnsendableBatch(payloads, str(exc)) from exc
        finally:
            self._entries, self._payloads, self._size, self._nodes = [], [], 0, {}
        return [header, b"".join(payloads)], n


class UnsendableBatch(Exception):
    """A batch whose header could not be encoded (:meth:`NodeBatcher.take`); ``payloads``: its
    reports, each as its rank sent it or with the relay's summary."""

    def __init__(self, payloads: list[bytes], reason: str) -> None:
        super().__init__(reason)
        self.payloads = payloads
