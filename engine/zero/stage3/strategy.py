"""ZeRO stage 3 as a strategy of the engine (the protocol in ``zero/strategy.py``).

Every rank holds 1/N of P (16-bit parameter shards), G (16-bit gradient shards) and O (fp32
master + Adam m, v of its shards): (2 + 2 + 12) Psi / N bytes in mixed precision, (4 + 4 + 8)
Psi / N in fp32 (the shard is its own master), plus the full tensors of the persistent
parameters. Full parameters exist only while their module runs (``coordinator``).

Per step and per rank it moves, in elements (before the (N-1)/N of ring algorithms): an
all-gather of every non-persistent parameter in forward and again in backward, minus what
``stage3_max_reuse_distance`` keeps alive between the two; a reduce-scatter of every gradient;
one all-gather of the persistent parameters after the optimizer step. That is the paper's
3 Psi, minus Psi_persistent, minus the reuse.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from zeroscope.agent.schema import MemoryBytes
from zeroscope.engine.config import DeepSpeedConfig
from zeroscope.engine.optim import AdamState
from zeroscope.engine.precision import DTYPES, copy_master_to_params, master_copy
from zeroscope.engine.zero.strategy import Shard

from .coordinator import ParameterCoordinator
from .gathered import EngineParams
from .grads import GradReducer
from .hooks import Stage3Hooks
from .partition import CommLike, Partition
from .save import NOT_GATHERED, SafetensorsWriter, is_safetensors, write_model_file

logger = logging.getLogger(__name__)


class Stage3Strategy:
    """Parameters, gradients and optimizer state sharded; parameters gathered just in time."""

    stage = 3
    sharded = True

    def __init__(
        self,
        *,
        module: nn.Module,
        groups: Sequence[Sequence[nn.Parameter]],
        comm: CommLike,
        config: DeepSpeedConfig,
    ) -> None:
        self.module = module
        self.zero = zero = config.zero_optimization
        dtype = DTYPES[config.precision]
        group_of = {p: index for index, group in enumerate(groups) for p in group}
        # Frozen parameters (in no group) are sharded too but never stepped: a group of their
        # own after the trainable ones, with no Shard.
        frozen = len(groups)
        named = list(module.named_parameters())
        # Parameters sorted by group: each group's shards are one contiguous range, so each
        # group's master is a view of one flat fp32 buffer.
        named.sort(key=lambda item: group_of.get(item[1], frozen))
        self.partition = Partition(
            named,
            dtype=dtype,
            persistence_threshold=zero.stage3_param_persistence_threshold,
            model_persistence_threshold=zero.stage3_model_persistence_threshold,
            comm=comm,
        )
        self.coordinator = ParameterCoordinator(
            self.partition,
            prefetch_bucket_size=zero.stage3_prefetch_bucket_size,
            max_live_parameters=zero.stage3_max_live_parameters,
            max_reuse_distance=zero.stage3_max_reuse_distance,
        )
        owner = EngineParams(self)  # GatheredParameters finds the engine through the parameter
        for sp in self.partition.params:
            sp.param._zs_owner = owner  # type: ignore[attr-defined]
        self.hooks = Stage3Hooks(module, self.coordinator)
        self.reducer = GradReducer(
            self.partition, bucket_numel=zero.reduce_bucket_size, overlap_comm=zero.overlap
        )
        # With optimizer offload O is built on the host by the offload store from the 16-bit
        # shards: no fp32 master or moments on the device, not even for a moment.
        offloaded = zero.offload_optimizer.device != "none"
        shards = self.partition.shards
        # The fp32 master covers only the shards the optimizer steps (the trainable ones come
        # first): frozen parameters keep no fp32 copy, as in DeepSpeed.
        stepped = sum(sp.shard_numel for sp in self.partition.params if sp.param in group_of)
        self.master = shards if offloaded else master_copy(shards[:stepped])
        self._shards: list[Shard] = []
        start = 0
        for index in range(len(groups)):
            end = start + sum(
                sp.shard_numel for sp in self.partition.params if group_of.get(sp.param) == index
            )
            # DeepSpeed's sub_group_size: the optimizer steps at most this many elements at a
            # time, which bounds the fp32 temporaries of the step.
            for lo in range(start, end, zero.sub_group_size):
                view = self.master[lo : min(lo + zero.sub_group_size, end)]
                state = (
                    AdamState.elsewhere(view.device) if offloaded else AdamState.zeros_like(view)
                )
                self._shards.append(Shard(master=view, state=state, group=index))
            start = end
        # Frozen parameters: their shard (and, when persistent, the full copy every rank
        # keeps) is in P like any other, but they have no gradient or optimizer state.
        size = self.partition.element_size
        self.frozen_shard_bytes = size * sum(
            sp.shard_numel for sp in self.partition.params if sp.param not in group_of
        )
        self.frozen_persistent_bytes = size * sum(
            sp.numel for sp in self.partition.params if sp.persistent and sp.param not in group_of
        )
        self._trainable_total = sum(
            sp.numel for sp in self.partition.params if sp.param in group_of
        )
        self._boundary = False
        self.gathered_peak_bytes = 0
        """Peak bytes of gathered full parameters during the last finished step."""

    # -- the strategy protocol ---------------------------------------------------------------

    @property
    def shards(self) -> list[Shard]:
        return self._shards

    def begin_micro_step(self, *, boundary: bool) -> None:
        self._boundary = boundary

    def end_micro_step(self) -> None:
        """After backward: release what backward left gathered and launch the last bucket."""
        self.reducer.flush()
        self.coordinator.release_all()
        if self._boundary:
            self.gathered_peak_bytes = (
                self.coordinator.peak_live_numel * self.partition.element_size
            )
            self.coordinator.reset_peak()

    def hold_reductions(self, hold: bool) -> None:
        """Pipeline parallel (engine/parallel): while held, gradients accumulate full-size in
        ``param.grad`` over the micro-batches; released, they are bucketed for the next
        ``end_micro_step``'s reduce-scatters."""
        self.reducer.held = hold
        if not hold:
            self.reducer.take_held()

    def reduced_grads(self) -> list[torch.Tensor]:
        self.reducer.wait()
        grads = self.reducer.ensure()
        out, start = [], 0
        for shard in self._shards:
            out.append(grads[start : start + shard.master.numel()])
            start += shard.master.numel()
        return out

    def publish_params(self) -> None:
        """Masters -> 16-bit shards, then refresh the persistent full tensors (all-gather)."""
        self.coordinator.release_all()
        copy_master_to_params(self.master, self.partition.shards[: self.master.numel()])
        self.partition.refresh_persistent()

    def zero_grads(self) -> None:
        self.reducer.zero()

    def release_grads(self) -> None:
        """Optimizer offload: G went to the host; free it until the next backward."""
        self.reducer.release()

    def memory(self) -> MemoryBytes:
        """P = shards + persistent full tensors; G = gradient shards; O = master (when not the
        shard itself) + Adam moments; gathered = peak of the last step."""
        master_bytes = (
            0
            if self.master.data_ptr() == self.partition.shards.data_ptr()
            else self.master.numel() * self.master.element_size()
        )
        persistent = self.partition.persistent_bytes
        return MemoryBytes(
            params=self.partition.shard_bytes + persistent,
            grads=self.reducer.grads.numel() * self.reducer.grads.element_size(),
            optim=master_bytes + sum(shard.state.nbytes for shard in self._shards),
            gathered_params=self.gathered_peak_bytes,
            persistent_params=persistent,
            frozen_params=self.frozen_shard_bytes + self.frozen_persistent_bytes,
        )

    @property
    def persistent_numel(self) -> int:
        """Elements of the parameters never sharded (reported in Hello's ParamCounts)."""
        return sum(sp.numel for sp in self.partition.params if sp.persistent)

    def param_counts(self) -> tuple[int, int]:
        """(trainable elements, elements of every partitioned parameter after padding: frozen
        ones are gathered like the others)."""
        return self._trainable_total, sum(sp.padded_numel for sp in self.partition.params)

    @property
    def trainable_numel(self) -> int:
        """Elements of this rank's flat shards that the optimizer steps. The trainable
        parameters' shards come first; the frozen ones follow and are never stepped."""
        return sum(shard.master.numel() for shard in self._shards)

    def frozen_shards(self) -> torch.Tensor:
        """A copy of this rank's shards of the frozen parameters (training dtype). Nothing
        else holds them: a checkpoint without them resumes with whatever the new model's
        initialisation put there (DeepSpeed saves them as ``frozen_param_fragments``)."""
        start, end = self.trainable_numel, self.partition.flat_numel
        if start == end:
            return torch.empty(0, dtype=self.partition.dtype, device="cpu")
        return self.partition.shard_span(start, end).detach().cpu().clone()

    def state_dict(self) -> dict[str, Any]:
        """This rank's shards: fp32 masters and Adam moments (the 16-bit shards follow from the
        masters), and the frozen parameters' shards."""
        return {
            "stage": 3,
            "world_size": self.partition.world_size,
            "frozen": self.frozen_shards(),
            "shards": [
                {
                    "master": shard.master.clone(),
                    "exp_avg": shard.state.exp_avg.clone(),
                    "exp_avg_sq": shard.state.exp_avg_sq.clone(),
                    "step": shard.state.step,
                }
                for shard in self._shards
            ],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("stage") != 3 or state.get("world_size") != self.partition.world_size:
            raise ValueError(
                f"checkpoint is stage {state.get('stage')} at world size "
                f"{state.get('world_size')}; this run is stage 3 at {self.partition.world_size}"
            )
        for shard, saved in zip(self._shards, state["shards"], strict=True):
            shard.master.copy_(saved["master"])
            shard.state.exp_avg.copy_(saved["exp_avg"])
            shard.state.exp_avg_sq.copy_(saved["exp_avg_sq"])
            shard.state.step = int(saved["step"])
        frozen = state.get("frozen")
        if frozen is not None and frozen.numel():
            # The frozen shards follow the trainable ones; the master (when separate) holds
            # only the trainable ones.
            start = self.trainable_numel
            self.partition.shards[start : start + frozen.numel()].copy_(frozen)
        self.publish_params()

    # -- stage 3 only ------------------------------------------------------------------------

    def register_external_parameter(self, module: nn.Module, param: nn.Parameter) -> None:
        """``param`` is used inside ``module``'s forward though another module owns it."""
        self.coordinator.register_external_parameter(module, param)

    def consolidated_16bit_state_dict(
        self, exclude_frozen_parameters: bool = False
    ) -> dict[str, torch.Tensor] | None:
        """Every parameter gathered whole, in the module's ``state_dict`` names (a tied weight
        under each of its names); returned on rank 0, None elsewhere. Collective: every rank
        must call it. ``exclude_frozen_parameters`` leaves out parameters without grad. Only
        rank 0 keeps what is gathered, on the host, one parameter at a time."""
        keep = self.partition.rank == 0
        full: dict[int, torch.Tensor] = {}

        def take(sp: Any, tensor: torch.Tensor) -> None:
            if keep:  # only rank 0 holds the gathered weights, on the host
                full[id(sp.param)] = tensor.detach().to("cpu", copy=True)

        self._gather_each(take)
        if not keep:
            return None
        out: dict[str, torch.Tensor] = {}
        for name, value in self.module.state_dict(keep_vars=True).items():
            if exclude_frozen_parameters and id(value) in full and not value.requires_grad:
                continue
            out[name] = full.get(id(value), value.detach())
        return out

    def _gather_each(self, take: Any) -> None:
        """Every parameter whole, one at a time: ``take(sp, full_tensor)`` on every rank, then
        the gathered copy is released before the next (the device never holds more than one
        gathered parameter beyond its shards). Collective: every rank must call it."""
        self.coordinator.release_all()
        for sp in self.partition.params:
            if sp.persistent:
                take(sp, sp.param.detach())
                continue
            self.partition.all_gather([sp], prefetched=False).wait()
            take(sp, sp.param.detach())
            self.partition.release(sp)

    def _write_consolidated(self, path: str, exclude_frozen_parameters: bool) -> None:
        """The 16-bit weights streamed into a safetensors ``path`` by rank 0, parameter by
        parameter as they are gathered: neither the device nor the host ever holds the whole
        model."""
        state = self.module.state_dict(keep_vars=True)
        names: dict[int, list[str]] = {}
        specs: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}
        by_param = {id(sp.param): sp for sp in self.partition.params}
        for name, value in list(state.items()):
            sp = by_param.get(id(value))
            if sp is not None and exclude_frozen_parameters and not value.requires_grad:
                del state[name]
            elif sp is not None:
                names.setdefault(id(value), []).append(name)
                specs[name] = (self.partition.dtype, tuple(sp.shape))
            else:
                specs[name] = (value.dtype, tuple(value.shape))
        writer = SafetensorsWriter(path, specs) if self.partition.rank == 0 else None
        failed: list[BaseException] = []

        def take(sp: Any, tensor: torch.Tensor) -> None:
            # A failed write must not stop rank 0's gathers: the other ranks are in them too.
            if writer is not None and not failed:
                try:
                    for name in names.get(id(sp.param), []):
                        writer.write(name, tensor.reshape(sp.shape))
                except Exception as exc:
                    failed.append(exc)

        self._gather_each(take)
        if writer is None:
            return
        try:
            if failed:
                raise failed[0]
            for name, value in state.items():
                if id(value) not in by_param:  # buffers
                    writer.write(name, value)
        except BaseException:
            writer.abort()
            raise
        writer.close()

    def save_16bit_model(
        self,
        save_dir: str,
        save_filename: str = "pytorch_model.bin",
        exclude_frozen_parameters: bool = False,
    ) -> bool:
        """DeepSpeed's ``save_16bit_model``: consolidated 16-bit weights written by rank 0 when
        ``stage3_gather_16bit_weights_on_model_save`` is true; otherwise nothing is saved, the
        reason is logged and False returned. Every rank must call it."""
        path = os.path.join(save_dir, save_filename)
        if not self.zero.stage3_gather_16bit_weights_on_model_save:
            if self.partition.rank == 0:
                logger.warning(NOT_GATHERED.format(path=path, world=self.partition.world_size))
            return False
        if self.partition.rank == 0:
            os.makedirs(save_dir, exist_ok=True)
        if is_safetensors(path):  # streamed: no rank holds the whole model
            self._write_consolidated(path, exclude_frozen_parameters)
            return True
        # DeepSpeed's pytorch_model.bin is one torch.save'd dict: rank 0 holds it on the host.
        state = self.consolidated_16bit_state_dict(exclude_frozen_parameters)
        if state is not None:
            write_model_file(path, state)
        return True
