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

SCHEMA_VERSION = 2
"""Bumped on any incompatible change; a Hello with another version is rejected."""

MAX_MESSAGE_BYTES = 8 * 1024 * 1024
"""Largest message a receiver accepts (a StepReport of a huge ZeRO-3 model with thousands of
collectives is well under 1 MiB)."""

Precision = Literal["fp32", "bf16", "fp16"]
OffloadDevice = Literal["none", "cpu", "nvme"]
CollectiveOp = Literal["all_gather", "reduce_scatter", "all_reduce", "broadcast", "reduce", "p2p"]
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


class ConfigSummary(msgspec.Struct, omit_defaults=True):
    """What a viewer needs to predict this rank's memory and traffic with the ZeRO formulas."""

    stage: int
    precision: Precision
    dp_world_size: int
    offload_optimizer: OffloadDevice = "none"
    offload_param: OffloadDevice = "none"
    overlap_comm: bool = False
    micro_batch_size: int = 1
    gradient_accumulation_steps: int = 1
    train_batch_size: int = 1
    gradient_clipping: float = 0.0
    reduce_bucket_size: int = 500_000_000
    allgather_bucket_size: int = 500_000_000
    prefetch_bucket_size: int = 50_000_000
    param_persistence_threshold: int = 100_000
    max_live_parameters: int = 1_000_000_000
    max_reuse_distance: int = 1_000_000_000
    optimizer: str = "AdamW"
    loss_scale_window: int = 1000
    min_loss_scale: float = 1.0


class ParamCounts(msgspec.Struct, omit_defaults=True):
    """Parameter element counts (Psi and friends) as the engine sees them."""

    total: int
    """Psi: every parameter element of the model (tied weights counted once)."""
    trainable: int
    persistent: int = 0
    """Stage 3: elements never sharded (numel <= stage3_param_persistence_threshold)."""
    padded_total: int = 0
    """Elements after padding each flat buffer to a multiple of the DP world size."""
    largest_layer: int = 0


class ParallelLayout(msgspec.Struct, omit_defaults=True):
    """A rank's place in a 3D-parallel job (tensor x data x pipeline) and, with a pipeline, the
    schedule it runs. Sent once (in Hello); absent for plain data parallelism."""

    dp: int = 0
    pp: int = 0
    tp: int = 0
    dp_size: int = 1
    pp_size: int = 1
    tp_size: int = 1
    schedule: str = ""
    """torch.distributed.pipelining schedule class, e.g. ``Schedule1F1B`` ("" = no pipeline)."""
    microbatches: int = 0
    num_stages: int = 0
    """Pipeline stages in all (more than pp_size with interleaved / virtual stages)."""
    stages: list[int] = msgspec.field(default_factory=list)
    """The stage indices this rank runs."""
    parts: list[int] = msgspec.field(default_factory=list)
    """Layer boundaries: stage s holds layers ``parts[s] <= i < parts[s + 1]``."""
    plan: list[str] = msgspec.field(default_factory=list)
    """The schedule's own plan for this rank (``pipeline_order``), compute actions in order as
    ``"<stage><F|B|I|W><microbatch>"``; empty when torch's plan is incomplete."""


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


class MemoryBytes(msgspec.Struct, omit_defaults=True):
    """Bytes this rank holds, by part. P/G/O are exact engine accounting; A is the peak of bytes
    saved for backward within the step (saved-tensor hooks). Allocator figures sit beside them."""

    params: int = 0
    grads: int = 0
    optim: int = 0
    activations: int | None = None
    activations_step: int = 0
    """The step whose forward/backward ``activations`` was counted on (the agent samples every
    N-th step, see agent/live.py); 0 = not said."""
    gathered_params: int = 0
    """Stage 3: full parameters currently gathered (transient; also counted apart from P)."""
    persistent_params: int = 0
    """Stage 3: never-sharded small parameters (included in ``params``)."""
    host_params: int = 0
    host_grads: int = 0
    host_optim: int = 0
    """Offloaded parts, in host memory or staged for NVMe (not included in params/grads/optim)."""
    nvme_bytes: int = 0
    device_allocated: int | None = None
    device_reserved: int | None = None
    device_peak: int | None = None


class Phases(msgspec.Struct, omit_defaults=True):
    """Wall time of the step's phases on this rank, seconds. None = phase not observed."""

    data: float | None = None
    forward: float | None = None
    backward: float | None = None
    optimizer: float | None = None


class Collective(msgspec.Struct, array_like=True, gc=False):
    """One collective as issued by the engine. ``nbytes`` follows nccl-tests: the full
    (gathered) size S for all-gather and reduce-scatter, the buffer size for all-reduce.
    (``gc=False``: scalar fields only, so the collector decodes thousands of them per report
    without garbage-collector tracking; the wire format is unchanged.)"""

    op: CollectiveOp
    nbytes: int
    group_size: int
    start_s: float
    """Issue instant, seconds since this rank's step start."""
    duration_s: float
    """Issue to completion."""
    exposed_s: float
    """Part of duration_s the training loop waited for (the rest was hidden behind compute)."""
    prefetched: bool = False
    label: str = ""


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
    """Everything measured on one rank in one optimizer step, sent once at the step's end."""

    rank: int
    step: int
    wall_ns: int
    duration_s: float
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
    host: HostSample | None = None
    dropped: int = 0
    """Messages this rank's publisher dropped (back-pressure) since its previous report."""
    pipeline: PipelineStep | None = None


class Event(_Base, tag="event"):
    """Something that happened at an instant; sent at once, not batched."""

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


Message = Hello | StepReport | Event | Heartbeat | Bye

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
    if not (0 <= message.rank < _MAX_RANK and 0 <= step < _INT64 and -_INT64 <= instant < _INT64):
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
