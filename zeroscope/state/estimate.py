"""``zeroscope estimate``'s figures: model-state bytes per rank by the ZeRO formulas
(:mod:`.formulas`), where the offloaded part lives (host memory or NVMe) and the communication
volume per step, for each ZeRO stage asked. The command only formats these rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from .formulas import ModelStateBytes, comm_bytes_per_step, model_state_bytes


@dataclass(frozen=True)
class StageEstimate:
    """One stage's row: the formulas' bytes, the offload's placement and the step's traffic."""

    stage: int
    memory: ModelStateBytes
    host: float
    """Bytes offloaded to host memory."""
    nvme: float
    """Bytes offloaded to NVMe."""
    comm: float
    """The step's collectives' message bytes (the paper's 2Ψ / 3Ψ, in nccl-tests' size
    convention: what a run's comm/step counts, agent/schema.py ``Collective.nbytes``)."""
    sent: float
    """What each rank sends of ``comm`` on a ring: (N-1)/N of it (nothing on one rank)."""


def placement(
    m: ModelStateBytes, offload_optimizer: str, offload_param: str
) -> tuple[float, float]:
    """(host memory, NVMe) bytes of the offloaded parts. The formulas say what leaves the device;
    where it goes follows DeepSpeed: with an NVMe optimizer offload the optimizer states live on
    NVMe while the fp32 gradient shard the host optimizer consumes stays in host memory; with an
    NVMe parameter offload the parameter shard lives on NVMe."""
    nvme = (m.host_optim if offload_optimizer == "nvme" else 0.0) + (
        m.host_params if offload_param == "nvme" else 0.0
    )
    return m.host_total - nvme, nvme


def stage_estimates(
    psi: float,
    ranks: int,
    stages: list[int],
    precision: str,
    offload_optimizer: str,
    offload_param: str,
    trainable: float | None = None,
) -> list[StageEstimate]:
    """A row per stage. Listing several stages, each offload applies only where that stage
    allows it (the optimizer offload from stage 1, the parameter offload at stage 3).
    ``trainable`` (default: all of ``psi``): the parameters with gradients and optimizer
    state; the frozen rest is in P only (zeroscope.state.formulas.model_state_bytes)."""
    rows = []
    for stage in stages:
        offload = offload_optimizer if stage >= 1 else "none"
        param = offload_param if stage == 3 else "none"
        m = model_state_bytes(psi, ranks, stage, precision, offload, param, trainable=trainable)
        host, nvme = placement(m, offload, param)
        comm = comm_bytes_per_step(psi, stage, precision, trainable)
        rows.append(StageEstimate(stage, m, host, nvme, comm, comm * (ranks - 1) / ranks))
    return rows
