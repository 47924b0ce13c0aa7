"""ZeRO-Offload and ZeRO-Infinity as a strategy wrapper: ``offload_optimizer`` (stages 1-3) and
``offload_param`` (stage 3) around any ZeRO strategy (zero/strategy.py's protocol).

The wrapped strategy keeps doing what it does (buckets, reduce-scatters, gathers); this wrapper
moves the optimizer step to where O lives (offload_store.py) and the 16-bit shards to where P
lives (offload_param.py). One step, as zero-facts §6 tells it:

1. the engine unscales, measures and clips the averaged gradient shards on the device;
2. ``optimizer_step``: device -> host copy of each fp32 gradient shard (into a persistent host
   buffer, ``host_grads``) when O is off the device;
3. Adam on the host (or unit by unit through NVMe swap files), the same ``adam_step`` as without
   offload, so the losses are the same losses;
4. each updated master chunk is cast into the 16-bit parameter shard where it lives: host ->
   device when P is on the device, host -> host (no transfer) or file when P is offloaded;
5. ``publish_params``: the wrapped strategy's all-gather (stages 1-2) or persistent-parameter
   refresh (stage 3).

Host <-> device copies go through :class:`~.offload_copy.Copier` (16-bit casts into pinned
staging, asynchronous copies timed with CUDA events on a GPU, ``perf_counter_ns`` on the CPU);
file reads/writes are timed by the swapper (engine/nvme.py). Everything is reported with
``Telemetry.transfer`` (direction, bytes, start, end), from the training thread. On a CPU-only
machine "device" and "host" buffers are still separate tensors, so the same copies run and are
measured (docs/offload.md).

With O off the device, the device gradient shards are freed once copied to the host (they are
made again by the next backward): between steps the device holds no G, as in DeepSpeed.
"""

from __future__ import annotations

from typing import Any

import torch

from zeroscope.agent.schema import MemoryBytes, TransferDirection

from .config import DeepSpeedConfig
from .host_memory import host_empty, pinned_bytes
from .nvme import NvmeSwapper
from .offload_copy import Copier
from .offload_param import ParamHome
from .offload_store import DeviceStore, HostStore, HyperOf, NvmeStore, Store
from .optim import AdamState
from .process_group import Comm
from .zero.strategy import ZeroStrategy


def param_shard_views(strategy: Any) -> list[torch.Tensor]:
    """The 16-bit parameter elements each of the strategy's shards updates, one view per
    shard (same numel as ``shard.master``)."""
    if hasattr(strategy, "partition"):  # stage 3: shards lie back to back in partition.shards
        out, start = [], 0
        for shard in strategy.shards:
            n = shard.master.numel()
            out.append(strategy.partition.shards[start : start + n])
            start += n
        return out
    return [b.flat[b.start : b.end] for b in strategy._buckets]  # stages 0-2 (zero/bucketed.py)


class OffloadStrategy:
    """See the module docstring; implements zero/strategy.py's protocol plus
    ``optimizer_step``, which the engine calls instead of its own Adam loop."""

    def __init__(self, inner: ZeroStrategy, *, config: DeepSpeedConfig, comm: Comm) -> None:
        zero = config.zero_optimization
        self.inner = inner
        self.stage = inner.stage
        self.sharded = inner.sharded
        self.tel = comm.tel
        self.optimizer_device = zero.offload_optimizer.device
        self.param_device = zero.offload_param.device
        opt = zero.offload_optimizer
        pin = opt.pin_memory
        self.copier = Copier(comm.tel, pin=pin)
        self.params: ParamHome | None = None
        if self.param_device != "none":
            self.params = ParamHome(
                inner, zero.offload_param, tel=comm.tel, rank=comm.rank, pin=pin, copier=self.copier
            )
        shards = inner.shards
        numels = [s.master.numel() for s in shards]
        self.offsets = [sum(numels[:i]) for i in range(len(numels))]
        self.views: list[torch.Tensor] | None
        if self.params is not None:
            self.views = self.params.views(numels)
        else:
            self.views = param_shard_views(inner)
        self.store: Store
        if self.optimizer_device == "none":
            self.store = DeviceStore(shards)
        elif self.optimizer_device == "cpu":
            self.store = HostStore(shards, pin=pin)
        else:
            assert opt.nvme_path is not None  # checked by the config
            swapper = NvmeSwapper(opt.nvme_path, rank=comm.rank, purpose="optim", tel=comm.tel)
            self.store = NvmeStore(
                shards,
                swapper=swapper,
                buffer_count=opt.buffer_count,
                unit_numel=max(1, min(zero.sub_group_size, max(numels, default=1))),
                pin=pin,
            )
        self.host_grads = (
            [host_empty(n, torch.float32, pin=pin) for n in numels] if self.store.on_host else []
        )
        if self.store.on_host:
            self._free_device_optimizer_state()

    def _free_device_optimizer_state(self) -> None:
        """O now lives off the device: point the wrapped strategy's masters at the 16-bit
        shards themselves (so its ``copy_master_to_params`` is a no-op and it counts no master
        bytes) and drop its Adam moments."""
        # NVMe parameters have no in-memory shard: a one-element stand-in that keeps the numel
        # (stage 3 slices its gradient buffer by ``shard.master.numel()``).
        device = self.inner.shards[0].master.device if self.inner.shards else torch.device("cpu")
        views = self.views or [
            torch.zeros(1, device=device).expand(s.master.numel()) for s in self.inner.shards
        ]
        for shard, view in zip(self.inner.shards, views):
            shard.master = view
            shard.state = AdamState.elsewhere(device)
        if hasattr(self.inner, "partition"):
            self.inner.master = self.inner.partition.shards  # type: ignore[attr-defined]

    # -- the protocol: delegated --------------------------------------------------------------

    @property
    def shards(self) -> list[Any]:
        return self.store.shards if isinstance(self.store, HostStore | DeviceStore) else []

    def begin_micro_step(self, *, boundary: bool) -> None:
        self.inner.begin_micro_step(boundary=boundary)

    def end_micro_step(self) -> None:
        self.inner.end_micro_step()

    def reduced_grads(self) -> list[torch.Tensor]:
        return self.inner.reduced_grads()

    def zero_grads(self) -> None:
        self.inner.zero_grads()

    def param_counts(self) -> tuple[int, int]:
        return self.inner.param_counts()

    def __getattr__(self, name: str) -> Any:
        # Stage-3 extras (register_external_parameter, save_16bit_model, ...) pass through.
        return getattr(self.inner, name)

    # -- the step -----------------------------------------------------------------------------

    def _write_param(self, shard: int, start: int, master: torch.Tensor) -> Any:
        params_on_host = self.params is not None
        if self.views is None:  # NVMe parameters: staged on the host, one file write at the end
            assert self.params is not None
            dst = self.params.staging(self.offsets[shard] + start, master.numel())
        else:
            dst = self.views[shard][start : start + master.numel()]
        direction: TransferDirection | None = None
        if self.store.on_host and not params_on_host:
            direction = "h2d"
        elif not self.store.on_host and params_on_host:
            direction = "d2h"
        self.copier.copy(direction, dst, master)
        return self.copier.last_event  # until it completes, a device copy may read ``master``

    def optimizer_step(self, grads: list[torch.Tensor], hyper: HyperOf) -> None:
        """Adam where O lives, then the 16-bit parameters where P lives (module docstring)."""
        if self.store.on_host:
            for host, g in zip(self.host_grads, grads):
                self.copier.copy("d2h", host, g)
            self.copier.flush()  # CPU Adam reads them now
            grads = self.host_grads
            release = getattr(self.inner, "release_grads", None)
            if release is not None:
                release()
        if self.params is not None:
            self.params.begin_write()
        self.store.step(grads, hyper, self._write_param)
        if self.params is not None:
            self.copier.flush()  # the host reads what the copies wrote (files, host shards)
            self.params.end_write()
        else:
            # Parameters on the device: no host sync. The next forward's kernels run on the
            # stream the copies went on, after them; page-locked sources are guarded by events
            # (staging, the NVMe pool), and the host masters are next written after the next
            # step's gradient flush, which completes after these copies on the same stream.
            self.copier.poll()

    def publish_params(self) -> None:
        if hasattr(self.inner, "partition"):
            # Stage 3: the shards are already written; refresh the persistent full tensors.
            self.inner.coordinator.release_all()  # type: ignore[attr-defined]
            self.inner.partition.refresh_persistent()
        else:
            self.inner.publish_params()

    # -- accounting and checkpoints -----------------------------------------------------------

    def memory(self) -> MemoryBytes:
        m = self.inner.memory()
        if self.params is not None and self.params.host is not None:
            m.params -= self.params.host_bytes
        if self.params is not None:
            # The frozen shards left the device with the others (to the host or NVMe); their
            # full persistent copies stay.
            m.frozen_params = getattr(self.inner, "frozen_persistent_bytes", 0)
        m.host_params = self.params.host_bytes if self.params is not None else 0
        m.host_grads = sum(g.numel() * g.element_size() for g in self.host_grads)
        m.host_optim = self.store.host_bytes
        m.host_pinned = pinned_bytes(self._host_buffers())
        m.nvme_bytes = self.store.nvme_bytes + (self.params.nvme_bytes if self.params else 0)
        return m

    def _host_buffers(self) -> list[torch.Tensor]:
        buffers = [*self.host_grads, *self.store.host_buffers(), *self.copier.staging_buffers]
        if self.params is not None:
            buffers.extend(self.params.host_buffers())
        return buffers

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"shards": self.store.state_shards()}
        if hasattr(self.inner, "partition"):
            state.update(
                stage=3,
                world_size=self.inner.partition.world_size,
                frozen=self.inner.frozen_shards(),  # type: ignore[attr-defined]
            )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if hasattr(self.inner, "partition"):
            world = self.inner.partition.world_size
            if state.get("stage") != 3 or state.get("world_size") != world:
                raise ValueError(
                    f"checkpoint is stage {state.get('stage')} at world size "
                    f"{state.get('world_size')}; this run is stage 3 at {world}"
                )
        self.store.load(state["shards"])
        frozen = state.get("frozen")
        if self.params is not None:
            self.params.begin_write(frozen)
        elif frozen is not None:  # stage 3, parameters on the device
            part = self.inner.partition  # type: ignore[attr-defined]
            part.shards[part.flat_numel - frozen.numel() :].copy_(frozen)
        for i, saved in enumerate(state["shards"]):
            self._write_param(i, 0, saved["master"].to(torch.float32))
        self.copier.flush()
        if self.params is not None:
            self.params.end_write()
        self.publish_params()

    def close(self) -> None:
        """Remove the NVMe swap files (also done at exit)."""
        if isinstance(self.store, NvmeStore):
            self.store.swapper.close()
        if self.params is not None:
            self.params.close()


def make_offload(strategy: ZeroStrategy, *, config: DeepSpeedConfig, comm: Comm) -> ZeroStrategy:
    """``strategy`` wrapped for offload when the config asks for it, else unchanged."""
    zero = config.zero_optimization
    if zero.offload_optimizer.device == "none" and zero.offload_param.device == "none":
        return strategy
    wrapped: ZeroStrategy = OffloadStrategy(strategy, config=config, comm=comm)
    return wrapped
