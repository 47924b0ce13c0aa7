"""Stage 3 ``offload_param``: the rank's 16-bit parameter shards live in host memory or in an
NVMe file, and each shard is brought to the device only for its all-gather (zero-facts §6).

Stage 3's partition (zero/stage3/partition.py) keeps the rank's shards in one flat buffer
``partition.shards`` and reads a parameter's shard through ``partition.shard_of(sp)`` / ``shard_span(start, end)``
when it gathers. This module swaps that buffer for a host one (cpu) or for an empty tensor backed by a
file (nvme), and routes ``shard_of`` through :meth:`ParamHome.fetch`, which copies the shard in
(host -> device, or file -> host -> device) and reports each copy. Prefetching in the stage-3
coordinator issues gathers early, so with NVMe the file reads run ahead of need too.

Updated parameters come back through :meth:`ParamHome.sink`, called by the optimizer store
with each updated master chunk after the step.

NVMe reads land in a ring of ``offload_param.buffer_count`` page-locked buffers (DeepSpeed's
``buffer_count``; each holds ``buffer_size`` elements, or the whole shard when smaller, grown to
a larger fetch the first time one comes), not in a new page-locked buffer per fetch: pinning
calls into the driver and locks pages, at every gather of every step. A buffer is taken again
only after the end event of the device copy that read it (:class:`~.nvme.BufferPool`'s guard),
so a read never overwrites bytes a copy has yet to carry. The staging of the rewritten file is
pageable: it is only written to the file, never copied to the device.
"""

from __future__ import annotations

from typing import Any

import torch

from zeroscope.agent.api import Telemetry

from .config_zero import OffloadParamConfig
from .host_memory import host_empty
from .nvme import BufferPool, NvmeSwapper
from .offload_copy import Copier

_UNIT = "params"


class ParamHome:
    """Owns the off-device 16-bit shards of a :class:`~.zero.stage3.Stage3Strategy`."""

    def __init__(
        self,
        strategy: Any,
        cfg: OffloadParamConfig,
        *,
        tel: Telemetry,
        rank: int,
        pin: bool,
        copier: Copier | None = None,
    ) -> None:
        part = strategy.partition
        self.partition = part
        self.tel = tel
        self.copier = copier or Copier(tel, pin=pin)
        self.device = part.shards.device
        self.dtype: torch.dtype = part.dtype
        self.numel = part.shards.numel()
        self.element_size = part.element_size
        self.pin = pin
        # The optimizer rewrites the trainable shards, which come first in the flat buffer
        # (stage 3 sorts frozen parameters last); the rest is written only at start-up.
        self.stepped_numel = sum(shard.master.numel() for shard in strategy.shards)
        self.swapper: NvmeSwapper | None = None
        self.host: torch.Tensor | None = None
        self._staging: torch.Tensor | None = None
        self.reads: BufferPool | None = None
        if cfg.device == "cpu":
            self.host = host_empty(self.numel, self.dtype, pin=pin)
            self.host.copy_(part.shards)
            part.shards = self.host
        else:
            assert cfg.nvme_path is not None  # checked by the config
            self.swapper = NvmeSwapper(cfg.nvme_path, rank=rank, purpose="param", tel=tel)
            self.swapper.allocate({_UNIT: self.numel * self.element_size})
            self.swapper.write(_UNIT, part.shards.detach().to("cpu").contiguous())
            part.shards = torch.empty(0, dtype=self.dtype, device=self.device)
            numel = max(1, min(cfg.buffer_size, self.numel))
            self.reads = BufferPool(max(1, cfg.buffer_count), numel, dtype=self.dtype, pin=pin)
        part.shard_of = self.fetch
        part.shard_span = self.fetch_span

    @property
    def host_bytes(self) -> int:
        """The host shards (cpu), or the ring of read buffers (nvme: the file holds the rest)."""
        if self.reads is not None:
            return self.reads.nbytes
        return 0 if self.host is None else self.numel * self.element_size

    def host_buffers(self) -> list[torch.Tensor]:
        """Every host buffer this home keeps (for the page-locked accounting)."""
        if self.reads is not None:
            return list(self.reads.buffers)
        return [] if self.host is None else [self.host]

    @property
    def nvme_bytes(self) -> int:
        return 0 if self.swapper is None else self.swapper.nbytes

    def views(self, numels: list[int]) -> list[torch.Tensor] | None:
        """Host views of each optimizer shard's parameters (None for NVMe: no host copy)."""
        if self.host is None:
            return None
        out, start = [], 0
        for n in numels:
            out.append(self.host[start : start + n])
            start += n
        return out

    def fetch(self, sp: Any) -> torch.Tensor:
        """A device copy of parameter ``sp``'s shard, for its all-gather."""
        return self.fetch_span(sp.offset, sp.offset + sp.shard_numel, sp.name)

    def fetch_span(self, start: int, end: int, label: str = "") -> torch.Tensor:
        """A device copy of elements ``[start, end)`` of the rank's flat shards (one read and
        one copy for a whole bucket of adjacent parameters)."""
        n = end - start
        out = torch.empty(n, dtype=self.dtype, device=self.device)
        if self.host is not None:
            self.copier.copy("h2d", out, self.host[start:end], label)
            return out
        assert self.swapper is not None and self.reads is not None
        index = self.reads.take(numel=n)
        assert index is not None  # blocking take: every fetch gives its buffer back
        try:
            src = self.reads.buffers[index][:n]
            self.swapper.record(self.swapper.read(_UNIT, src, offset=start * self.element_size))
            self.swapper.report()
            self.copier.copy("h2d", out, src, label)
        finally:
            # Taken again only once the device copy has read it.
            self.reads.give(index, self.copier.last_event)
        return out

    # -- NVMe: the optimizer writes the new 16-bit shards through a staging buffer ------------

    def begin_write(self, frozen: torch.Tensor | None = None) -> None:
        """Before the optimizer writes the trainable shards: ``frozen`` (a checkpoint's frozen
        shards) replaces the frozen elements. With NVMe a whole new file is staged: the
        optimizer fills the trainable elements and the frozen ones come from ``frozen`` or are
        read back from the file, else the rewrite would replace them with whatever the fresh
        buffer held (NaN from the next gather)."""
        start = self.stepped_numel
        if self.host is not None:
            if frozen is not None:
                self.host[start:].copy_(frozen)
            return
        assert self.swapper is not None
        self._staging = host_empty(self.numel, self.dtype, pin=False)  # file-bound only
        kept = self._staging[start:]
        if frozen is not None:
            kept.copy_(frozen)
        elif kept.numel():
            self.swapper.record(self.swapper.read(_UNIT, kept, offset=start * self.element_size))

    def staging(self, start: int, numel: int) -> torch.Tensor:
        """Where the updated shard elements ``[start, start + numel)`` go before the file."""
        assert self._staging is not None
        return self._staging[start : start + numel]

    def end_write(self) -> None:
        if self.swapper is not None and self._staging is not None:
            self.swapper.record(self.swapper.write(_UNIT, self._staging))
            self.swapper.report()
            self._staging = None

    def close(self) -> None:
        if self.swapper is not None:
            self.swapper.close()
