"""THE wire format of zeroscope: every message that crosses a socket or lands in a trace.

Both the agent (inside training ranks) and zeroscope (collector, trace store, TUI) import this
module; nothing else defines a message. Messages are msgspec Structs in a tagged union, encoded
as msgpack — no pickle anywhere. A receiver calls :func:`decode`, which rejects malformed,
oversize and unknown-version messages with :class:`SchemaError` (one line, names the problem).

Units: bytes are ints, durations are float seconds, instants are ``*_ns`` ints. Wall-clock
instants (``time.time_ns()``) are only for display; views align ranks by *step*, never by clock,
because ranks' clocks can be far apart. ``None`` means "not measured here" (shown as NA), never 0.
"""

from __future__ import annotations

from typing import Literal

import msgspec

# A node relay's batch header (agent/node_batch.py) and the handshake's claim are part of the
# wire too: the viewer side imports them from here.
from .node_batch import NODE_BATCH_VERSION as NODE_BATCH_VERSION
from .node_batch import BatchEntry as BatchEntry
from .node_batch import BatchError as BatchError
from .node_batch import NodeBatch as NodeBatch
from .node_batch import NodeStep as NodeStep
from .node_batch import decode_batch as decode_batch
from .node_batch import encode_batch as encode_batch
from .schema_config import ConfigSummary as ConfigSummary
from .schema_config import OffloadDevice as OffloadDevice
from .schema_config import ParallelLayout as ParallelLayout
from .schema_config import ParamCounts as ParamCounts
from .schema_config import Precision as Precision
from .schema_summary import SUMMARY_VERSION as SUMMARY_VERSION
from .schema_summary import OpTotals as OpTotals
from .schema_summary import StepSummary as StepSummary
from .schema_work import Work as Work
from .sender_claim import SenderClaim as SenderClaim

SCHEMA_VERSION = 2
"""Bumped on any incompatible change; a Hello with another version is rejected."""

MAX_MESSAGE_BYTES = 8 * 1024 * 1024
"""Largest message a receiver accepts (a StepReport of a huge ZeRO-3 model with thousands of
collectives is well under 1 MiB)."""

CollectiveOp = Literal[
    "all_gather",
    "reduce_scatter",
    "all_reduce",
    "broadcast",
    "reduce",
    "p2p",
    "all_to_all",
    "barrier",
    "gather",
    "scatter",
]
CollectiveClock = Literal["device", "host", "none"]
"""What measured a collective's ``duration_s``: CUDA events on the device's clock, the host's
clock where the host really waits for the op (CPU / gloo), or nothing (``none``: the op was
seen, its bytes are exact, but no clock saw it complete: duration, busbw and exposed are NA)."""
TransferDirection = Literal["d2h", "h2d", "nvme_read", "nvme_write"]
EventKind = Literal[
    "overflow",  # fp16 gradients had inf/nan on some rank; the step was skipped
    "scale_change",  # the dynamic loss scale moved (value = new scale)
    "scale_at_minimum",  # overflow with the scale already at min_loss_scale
    "nan_loss",  # the loss itself was nan/inf
    "checkpoint",  # a checkpoint was saved or loaded (message says which)
    "oom_warning",  # memory headroom low
    "error",  # an exception escaped the training loop
    "info",
]


class _Base(msgspec.Struct, tag_field="kind", forbid_unknown_fields=False, omit_defaults=True):
    """Common base: the tag rides in the ``kind`` field of the msgpack map."""


class Hello(_Base, tag="hello"):
    """First message of a rank: who it is and what it runs."""

    schema_version: int
    job_id: str
    rank: int
    world_size: int
    local_rank: int = 0
    node_rank: int = 0
    hostname: str = ""
    pid: int = 0
    device: str = "cpu"
    started_ns: int = 0
    config: ConfigSummary | None = None
    params: ParamCounts | None = None
    engine: str = "zeroscope"
    """Which engine reports (ours, or another through the public agent API)."""
    parallel: ParallelLayout | None = None
    local_world_size: int = 0
    """Ranks on this rank's node (torchrun's LOCAL_WORLD_SIZE; 0 = not said): lets a viewer tell
    which node a rank that never reported belongs to."""
    device_memory_bytes: int = 0
    """This rank's share of its device's memory [bytes]: a GPU's total memory, or on the CPU the
    host's RAM divided by the ranks on the node; 0 = not said. The advisor's headroom."""
    init_rss_peak_bytes: int = 0
    """The process's peak resident memory up to this Hello (``ru_maxrss``): what start-up
    (model construction, engine build) cost the host; 0 = not said."""
    spawned: bool = False
    """Started by the job itself (``torch.multiprocessing.spawn``), not by the launcher: its
    rank is its process group's, not the launcher's number for a process (which names the
    process that spawned it)."""


class MemoryBytes(msgspec.Struct, omit_defaults=True):
    """Bytes this rank holds, by part. P/G/O are exact engine accounting; A is the peak of bytes
    saved for backward within the step (saved-tensor hooks). Allocator figures sit beside them.
    P/G/O left out (None) mean "not reported" (an agent-API user who does not count them) and
    show as NA; 0 means "holds none"."""

    params: int | None = None
    grads: int | None = None
    optim: int | None = None
    activations: int | None = None
    activations_step: int = 0
    """The step whose forward/backward ``activations`` was counted on (the agent samples every
    N-th step, see agent/live.py); 0 = not said."""
    census_step: int = 0
    """The step P/G/O (and the host parts) were counted on, when not this one: the attach
    counts an engine's tensors on its first steps, then every N-th (agent/attach/session.py)
    and repeats the latest count between; 0 = counted on this step (the bundled engine's, every
    step) or not said."""
    gathered_params: int = 0
    """Stage 3: full parameters currently gathered (transient; also counted apart from P)."""
    persistent_params: int = 0
    """Stage 3: never-sharded small parameters (included in ``params``)."""
    host_params: int = 0
    host_grads: int = 0
    host_optim: int = 0
    """Offloaded parts, in host memory or staged for NVMe (not included in params/grads/optim)."""
    host_pinned: int | None = None
    """Page-locked bytes the engine's host buffers really hold (the CUDA host allocator rounds
    each block up to a power of two, so this can reach 2x their size); None: nothing pinned."""
    nvme_bytes: int = 0
    activations_layers: int = 0
    """Repeated blocks (``ParamCounts.layers``) entered in the measured forward; 0 = not split."""
    activations_in_layers: int = 0
    """Of ``activations``: bytes saved for backward inside those blocks (all of them)."""
    activations_layer_max: int = 0
    """The most any one block saved [bytes]: what recomputing it in backward holds again."""
    activations_layer_inputs: int = 0
    """Bytes of the blocks' inputs: what activation checkpointing of every block keeps."""
    device_allocated: int | None = None
    """CUDA: ``torch.cuda.memory_allocated`` of the rank's device at the step's end."""
    device_reserved: int | None = None
    device_peak: int | None = None
    """CUDA: the highest allocated bytes within this step. Exact when the process's allocator
    peak (``max_memory_allocated``, which zeroscope never resets) rose during the step; else
    the highest ``memory_allocated`` sample taken at the step's phase boundaries (a lower
    bound)."""
    frozen_params: int | None = None
    """Of ``params``: bytes of frozen parameters (no gradient, no optimizer state: a LoRA
    fine-tune's base model), as the rank holds them (whole at stages 0-2, its shard at stage
    3); None = not said (older agents), 0 = none frozen."""


class Phases(msgspec.Struct, omit_defaults=True):
    """Wall time of the step's phases on this rank, seconds. None = phase not observed."""

    data: float | None = None
    forward: float | None = None
    backward: float | None = None
    optimizer: float | None = None
    eval: float | None = None
    """An evaluation between two training steps, in the later one (a trainer's eval every N
    steps): forwards with autograd off, and before the step's first training forward,
    everything from the first of them to the last (its batches, its metrics). Kept out of
    ``forward`` and ``data``, so a step after an evaluation does not read as a slow one."""


class PhaseSpan(msgspec.Struct, array_like=True, gc=False):
    """One entry into a phase, on the step's time axis (the one ``Collective.start_s`` uses):
    seconds since this rank's step start. Gradient accumulation gives one span per phase per
    micro-batch, in order; ``Phases`` holds their sums."""

    name: str
    start_s: float
    duration_s: float


class Collective(msgspec.Struct, array_like=True, gc=False):
    """One collective as issued by the engine. ``nbytes`` follows nccl-tests: the full
    (gathered) size S for all-gather and reduce-scatter, the buffer size for all-reduce.
    (``gc=False``: scalar fields only, so the collector decodes thousands of them per report
    without garbage-collector tracking; the wire format is unchanged.)"""

    op: CollectiveOp
    nbytes: int
    group_size: int
    start_s: float
    """Issue instant, seconds since this rank's step start (the step the collective was issued
    in, which is the report that carries it)."""
    duration_s: float
    """Issue to completion."""
    exposed_s: float
    """Part of duration_s the training loop waited for (the rest was hidden behind compute)."""
    prefetched: bool = False
    label: str = ""
    clock: CollectiveClock = "host"
    """What measured ``duration_s`` (``none``: nothing did, every figure from it is NA). Last,
    with a default: older traces decode as the host clock they were measured on."""
    exposed_measured: bool = True
    """Whether ``exposed_s`` is a measurement of the loop's wait (False: NA)."""


class Transfer(msgspec.Struct, array_like=True, gc=False):
    """One offload transfer: device<->host copy or NVMe file read/write."""

    direction: TransferDirection
    nbytes: int
    start_s: float
    duration_s: float
    label: str = ""


class StageAction(msgspec.Struct, array_like=True, gc=False):
    """One pipeline compute action of this rank: forward (F), full backward (B), or the input-
    (I) and weight-gradient (W) halves of a zero-bubble backward."""

    kind: Literal["F", "B", "I", "W"]
    stage: int
    microbatch: int
    start_s: float
    """Seconds since the schedule step began."""
    duration_s: float


class PipelineStep(msgspec.Struct, omit_defaults=True):
    """What one pipeline schedule step did on this rank."""

    step_s: float
    """Wall time of the schedule step (all micro-batches' forward and backward)."""
    actions: list[StageAction] = msgspec.field(default_factory=list)
    p2p_wait_s: float = 0.0
    """Time spent waiting for activations / gradients from the neighbouring stages."""


class HostSample(msgspec.Struct, omit_defaults=True):
    """Background sampler figures; None = absent here (e.g. no NVML), shown as NA, never 0."""

    cpu_percent: float | None = None
    rss_bytes: int | None = None
    mem_available_bytes: int | None = None
    gpu_util_percent: float | None = None
    gpu_mem_used_bytes: int | None = None
    gpu_mem_total_bytes: int | None = None
    gpu_power_w: float | None = None
    pcie_tx_bytes_s: float | None = None
    pcie_rx_bytes_s: float | None = None


class StepReport(_Base, tag="step"):
    """Everything measured on one rank in one optimizer step, sent once at the step's end (or
    a little later: it waits for the collectives issued in the step to complete, so that each
    report covers its own step's phases and collectives, on one time axis)."""

    rank: int
    step: int
    wall_ns: int
    duration_s: float
    """From the previous step's end (or the first phase / collective of step 1) to this one's:
    the axis ``phase_spans`` and ``collectives`` are placed on."""
    phases: Phases = msgspec.field(default_factory=Phases)
    memory: MemoryBytes = msgspec.field(default_factory=MemoryBytes)
    collectives: list[Collective] = msgspec.field(default_factory=list)
    transfers: list[Transfer] = msgspec.field(default_factory=list)
    loss: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    loss_scale: float | None = None
    overflow: bool = False
    skipped: bool = False
    samples: int = 0
    """Samples this rank consumed in this step: its data-parallel share (micro-batch size x
    gradient accumulation steps), never the global batch. The viewer adds the ranks up. Ranks
    that share one data-parallel replica (tensor or pipeline peers) report it on one of them
    and 0 on the others; 0 everywhere means "not reported" (samples/s shows NA)."""
    host: HostSample | None = None
    dropped: int = 0
    """Messages this rank's publisher dropped (back-pressure) since its previous report."""
    pipeline: PipelineStep | None = None
    phase_spans: list[PhaseSpan] = msgspec.field(default_factory=list)
    """Where each phase ran within the step (empty from reporters that only give sums)."""
    collectives_unfinished: int = 0
    """Collectives issued in this step still incomplete when the report had to leave (they
    are not in ``collectives``)."""
    agent_overhead_s: float | None = None
    """Time the agent's own calls took on the training thread since the previous report
    (phases, collective wrapping, wait bookkeeping, step_end: agent/cost.py; the previous
    step_end's own time included). None from reporters that do not measure it."""
    work: Work | None = None
    """Tokens and model FLOPs of the step (None: the reporter says nothing of them)."""
    summary: StepSummary | None = None
    """What every view needs of this report, made by its node's relay from the fields above
    (agent/schema_summary.py); None from a rank's own sender, and the viewer makes it."""


class Event(_Base, tag="event"):
    """Something that happened at an instant; sent on its own (not batched), ahead of step
    reports still waiting."""

    rank: int
    step: int
    wall_ns: int
    event: EventKind
    message: str = ""
    value: float | None = None


class Heartbeat(_Base, tag="heartbeat"):
    """A rank is alive between steps (sent by the agent's sampler thread)."""

    rank: int
    step: int
    wall_ns: int
    dropped: int = 0
    host: HostSample | None = None


class Bye(_Base, tag="bye"):
    """A rank's last word: its exit status (0 = clean)."""

    rank: int
    step: int
    wall_ns: int
    exit_code: int = 0
    message: str = ""


class Admission(_Base, tag="admission"):
    """The collector's own record, never an agent's (the collector rejects one from a sender):
    what its door saw of one sender, so that every view can name a rank that never reports and
    say why, live and in replay. ``reason`` is ``"unauthenticated"`` (handshake refused: wrong
    token), ``"handshake"`` (a sender without zeroscope's credentials), a rejected message's
    reason (``"malformed"``, ``"oversize"``, ``"schema_version"``, ``"framing"``), or
    ``"admitted"`` (a connection with the right token: a node's launcher, or a rank that
    connected and sent nothing valid). Re-sent with running totals while it goes on; the
    newest record of a (reason, peer, claim) holds the totals.

    ``rank``, ``node_rank``, ``world_size``, ``hostname`` and ``role`` are what the sender
    *claimed* in its handshake (see :class:`SenderClaim`): -1 / 0 / "" when not said. A claim
    names a suspect; it is never proof and never makes a rank count as reporting."""

    wall_ns: int
    """The collector's clock."""
    reason: str
    count: int = 1
    unit: str = "message"
    """``"message"`` or ``"connection"`` (what ``count`` counts)."""
    peer: str = ""
    """The IP address the sender connected from ("" when ZeroMQ did not say)."""
    rank: int = -1
    node_rank: int = -1
    world_size: int = 0
    hostname: str = ""
    role: str = ""
    """``"rank"`` (a training rank's agent) or ``"launcher"`` (``zeroscope run`` on a node)."""
    detail: str = ""
    """The last rejection's one-line reason."""


Message = Hello | StepReport | Event | Heartbeat | Bye | Admission


_encoder = msgspec.msgpack.Encoder()
_INT64 = 1 << 63
_MAX_RANK = 1 << 24
_decoder = msgspec.msgpack.Decoder(Message)


class SchemaError(ValueError):
    """A message that cannot be accepted; ``str()`` is a one-line reason and ``reason`` a short
    code for counters: ``"oversize"``, ``"malformed"`` or ``"schema_version"``."""

    def __init__(self, message: str, reason: str = "malformed") -> None:
        super().__init__(message)
        self.reason = reason


def encode(message: Message) -> bytes:
    """msgpack bytes of one message."""
    return _encoder.encode(message)


def decode(data: bytes | memoryview) -> Message:
    """Validate and decode one message, or raise SchemaError with a one-line reason."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise SchemaError(
            f"message of {len(data)} bytes exceeds the {MAX_MESSAGE_BYTES}-byte limit",
            "oversize",
        )
    try:
        message = _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SchemaError(f"malformed message: {(str(exc) or 'empty').splitlines()[0]}") from None
    except Exception as exc:  # never let odd bytes crash a receiver (e.g. RecursionError)
        raise SchemaError(f"malformed message: {type(exc).__name__}") from None
    # Indexed trace columns are SQLite int64s; a rank or step outside sane ranges is garbage.
    step = getattr(message, "step", 0)
    instant = message.started_ns if isinstance(message, Hello) else message.wall_ns
    lowest = -1 if isinstance(message, Admission) else 0  # a claim may name no rank
    rank_ok = lowest <= message.rank < _MAX_RANK
    if not (rank_ok and 0 <= step < _INT64 and -_INT64 <= instant < _INT64):
        raise SchemaError(
            f"malformed message: rank {message.rank}, step {step} or instant out of range",
            "malformed",
        )
    if isinstance(message, Hello) and message.schema_version != SCHEMA_VERSION:
        raise SchemaError(
            f"unsupported schema_version {message.schema_version} from rank {message.rank} "
            f"(this zeroscope speaks {SCHEMA_VERSION})",
            "schema_version",
        )
    return message
