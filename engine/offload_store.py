"""Where O (fp32 master + Adam m, v) lives: on the device, in host memory, or in NVMe files.

Each store steps every shard with :func:`~.optim.adam_step` — the very function the engine uses
without offload, so an offloaded run's numbers are the same numbers — and hands each updated
master chunk to a *param sink* (``write_param(shard, start, master_chunk)``), which puts the
16-bit parameters back where they live (zero-facts §6).

- :class:`DeviceStore`: the strategy's own shards (used when only the parameters are offloaded).
- :class:`HostStore`: ZeRO-Offload. Masters and moments in host memory (page-locked when
  ``pin_memory`` and a GPU exist), ``12 Psi / N`` bytes per rank.
- :class:`NvmeStore`: ZeRO-Infinity. The same bytes in swap files, cut into units of at most
  ``sub_group_size`` elements (DeepSpeed swaps per sub-group too); one step reads every unit
  ahead of need into a pool of ``buffer_count`` host buffers, steps it, writes it behind.
  Adam is elementwise, so stepping a shard unit by unit changes no bit.

The host stores build O on the host from the strategy's 16-bit shards (the strategies make no
fp32 master or moments on the device when O is offloaded): each shard comes to the host in its
16-bit dtype and is widened there, so the device never holds a 4-byte copy to be thrown away.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch

from .host_memory import host_empty
from .nvme import BufferPool, NvmeSwapper, Timing
from .optim import AdamHyper, AdamState, adam_step
from .zero.strategy import Shard

ParamSink = Callable[[int, int, torch.Tensor], Any]
"""``write_param(shard_index, start, master_chunk)``: the updated fp32 master elements
``[start, start + len)`` of a shard, to be cast into the 16-bit parameters. Returns the CUDA
event after which the copy no longer reads ``master_chunk`` (None: it already does not)."""
HyperOf = Callable[[int], AdamHyper]


__all__ = ["DeviceStore", "HostStore", "NvmeStore", "Store", "host_empty"]


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """A host copy of ``t`` in its own dtype (a copy even when ``t`` is already on the host)."""
    return t.detach().to("cpu", copy=True)


def _saved(master: torch.Tensor, state: AdamState) -> dict[str, Any]:
    return {
        "master": _to_host(master),
        "exp_avg": _to_host(state.exp_avg),
        "exp_avg_sq": _to_host(state.exp_avg_sq),
        "step": state.step,
    }


def _load(master: torch.Tensor, state: AdamState, saved: dict[str, Any]) -> None:
    master.copy_(saved["master"])
    state.exp_avg.copy_(saved["exp_avg"])
    state.exp_avg_sq.copy_(saved["exp_avg_sq"])
    state.step = int(saved["step"])


class DeviceStore:
    """O stays with the strategy (on the device)."""

    on_host = False

    def __init__(self, shards: list[Shard]) -> None:
        self.shards = shards

    def step(self, grads: list[torch.Tensor], hyper: HyperOf, write_param: ParamSink) -> None:
        for i, (shard, g) in enumerate(zip(self.shards, grads)):
            adam_step(shard.master, g, shard.state, hyper(shard.group))
            write_param(i, 0, shard.master)

    def state_shards(self) -> list[dict[str, Any]]:
        return [_saved(s.master, s.state) for s in self.shards]

    def load(self, saved: list[dict[str, Any]]) -> None:
        for s, one in zip(self.shards, saved, strict=True):
            _load(s.master, s.state, one)

    def host_buffers(self) -> list[torch.Tensor]:
        return []

    host_bytes = 0
    nvme_bytes = 0


class HostStore:
    """O in host memory: a host copy of every master, and the moments beside it."""

    on_host = True

    def __init__(self, shards: list[Shard], *, pin: bool) -> None:
        self.shards = []
        for s in shards:
            master = host_empty(s.master.numel(), torch.float32, pin=pin)
            master.copy_(s.master.detach().to("cpu"))  # 16-bit to the host, widened there
            state = AdamState(
                exp_avg=torch.zeros(master.numel(), dtype=torch.float32, device="cpu"),
                exp_avg_sq=torch.zeros(master.numel(), dtype=torch.float32, device="cpu"),
                step=s.state.step,
            )
            if s.state.exp_avg.numel():  # moments the strategy already had (none when built
                state.exp_avg.copy_(s.state.exp_avg)  # for offload)
                state.exp_avg_sq.copy_(s.state.exp_avg_sq)
            self.shards.append(Shard(master=master, state=state, group=s.group))

    def step(self, grads: list[torch.Tensor], hyper: HyperOf, write_param: ParamSink) -> None:
        for i, (shard, g) in enumerate(zip(self.shards, grads)):
            adam_step(shard.master, g, shard.state, hyper(shard.group))
            write_param(i, 0, shard.master)

    def state_shards(self) -> list[dict[str, Any]]:
        return [_saved(s.master, s.state) for s in self.shards]

    def load(self, saved: list[dict[str, Any]]) -> None:
        for s, one in zip(self.shards, saved, strict=True):
            _load(s.master, s.state, one)

    def host_buffers(self) -> list[torch.Tensor]:
        return [s.master for s in self.shards]

    @property
    def host_bytes(self) -> int:
        return sum(s.master.numel() * 4 + s.state.nbytes for s in self.shards)

    nvme_bytes = 0


class NvmeStore:
    """O in swap files, ``[master | m | v]`` per unit of at most ``unit_numel`` elements."""

    on_host = True

    def __init__(
        self,
        shards: list[Shard],
        *,
        swapper: NvmeSwapper,
        buffer_count: int,
        unit_numel: int,
        pin: bool,
    ) -> None:
        self.swapper = swapper
        self.groups = [s.group for s in shards]
        self.numels = [s.master.numel() for s in shards]
        self.steps = [s.state.step for s in shards]
        self.units: list[tuple[int, int, int]] = [
            (i, lo, min(unit_numel, n - lo))
            for i, n in enumerate(self.numels)
            for lo in range(0, n, unit_numel)
        ]
        largest = max((n for _, _, n in self.units), default=0)
        swapper.allocate({self._name(u): 12 * u[2] for u in self.units})
        # More buffers than units would only hold copies of the same bytes.
        count = max(1, min(buffer_count, len(self.units)))
        self.pool = BufferPool(count, 3 * largest, dtype=torch.float32, pin=pin)
        self.load([_saved(s.master, s.state) for s in shards], report=False)

    @staticmethod
    def _name(unit: tuple[int, int, int]) -> str:
        return f"optim-s{unit[0]}-{unit[1]}"

    def _read_ahead(self, unit: int, *, block: bool) -> tuple[int, Future[Timing]] | None:
        index = self.pool.take(block=block)
        if index is None:
            return None
        n = self.units[unit][2]
        buf = self.pool.buffers[index][: 3 * n]
        return index, self.swapper.read_async(self._name(self.units[unit]), buf)

    def step(self, grads: list[torch.Tensor], hyper: HyperOf, write_param: ParamSink) -> None:
        """Read ahead as far as free buffers allow, step each unit, write it behind; returns
        once every write is on disk (a checkpoint or the next step may read the files)."""
        ahead: deque[tuple[int, Future[Timing]]] = deque()
        writes: list[Future[Timing]] = []
        issued = 0
        try:
            for j, (i, lo, n) in enumerate(self.units):
                while issued < len(self.units):
                    got = self._read_ahead(issued, block=issued == j)
                    if got is None:
                        break
                    ahead.append(got)
                    issued += 1
                index, reading = ahead.popleft()
                self.swapper.record(reading.result())
                buf = self.pool.buffers[index]
                master, m, v = buf[:n], buf[n : 2 * n], buf[2 * n : 3 * n]
                state = AdamState(exp_avg=m, exp_avg_sq=v, step=self.steps[i])
                adam_step(master, grads[i][lo : lo + n], state, hyper(self.groups[i]))
                # The buffer goes back once on disk, guarded by the parameter copy reading it.
                landed = write_param(i, lo, master)
                writes.append(
                    self.swapper.write_async(
                        self._name(self.units[j]),
                        buf[: 3 * n],
                        done=functools.partial(self.pool.give, index, landed),
                    )
                )
        finally:
            for index, reading in ahead:  # an error above: let reads finish, free buffers
                reading.exception()
                self.pool.give(index)
            for w in writes:
                w.exception()
        for w in writes:
            self.swapper.record(w.result())
        self.steps = [s + 1 for s in self.steps]
        self.swapper.report()

    def state_shards(self) -> list[dict[str, Any]]:
        out = []
        for i, n in enumerate(self.numels):
            flat = torch.empty(3, n, dtype=torch.float32, device="cpu")
            for k, lo, size in self.units:
                if k == i:
                    part = torch.empty(3 * size, dtype=torch.float32, device="cpu")
                    self.swapper.record(self.swapper.read(self._name((k, lo, size)), part))
                    flat[:, lo : lo + size] = part.view(3, size)
            out.append(
                {
                    "master": flat[0],
                    "exp_avg": flat[1],
                    "exp_avg_sq": flat[2],
                    "step": self.steps[i],
                }
            )
        self.swapper.report()
        return out

    def load(self, saved: list[dict[str, Any]], *, report: bool = True) -> None:
        if len(saved) != len(self.numels):
            raise ValueError(f"checkpoint has {len(saved)} shards, this run {len(self.numels)}")
        for unit in self.units:
            i, lo, n = unit
            one = saved[i]
            data = torch.zeros(3, n, dtype=torch.float32, device="cpu")
            for row, k in enumerate(("master", "exp_avg", "exp_avg_sq")):
                if one[k].numel():  # absent moments (a strategy built for offload): zeros
                    data[row].copy_(one[k].reshape(-1)[lo : lo + n])
            timing = self.swapper.write(self._name(unit), data.reshape(-1))
            if report:
                self.swapper.record(timing)
        self.steps = [int(one["step"]) for one in saved]
        if report:
            self.swapper.report()

    def host_buffers(self) -> list[torch.Tensor]:
        return list(self.pool.buffers)

    @property
    def host_bytes(self) -> int:
        """The staging pool (the files hold the rest)."""
        return self.pool.nbytes

    @property
    def nvme_bytes(self) -> int:
        return self.swapper.nbytes


Store = DeviceStore | HostStore | NvmeStore
