"""Which parameters to gather, prefetch, keep or release, and when.

A port of the policy of DeepSpeed's ``partitioned_param_coordinator.py``
(PartitionedParameterCoordinator), with DeepSpeed's knobs and meanings:

- The first forward+backward is *recorded*: the order in which modules fetch their parameters.
  From the next step on the trace is *complete* and drives prefetching; if a step deviates
  from it (data-dependent control flow, an eval forward) the trace is invalidated, that step
  runs without prefetch, and the following step records afresh.
- ``stage3_prefetch_bucket_size``: when a module fetches, the parameters of the next modules in
  the trace are gathered ahead, keeping up to this many elements prefetched but not yet used
  (DeepSpeed documents it as "the fixed buffer for prefetching"; its code adds up to a bucket
  on every fetch, so the window ahead grows until max_live_parameters stops it). 0 turns
  prefetch off.
- ``stage3_max_live_parameters``: prefetch never brings the gathered elements above this cap.
  The module that runs now is always gathered, so the bound is the cap plus one module.
  Deviation from DeepSpeed, on purpose: a parameter kept for reuse is released anyway when the
  cap is exceeded, so retention cannot grow the live set past the bound either.
- ``stage3_max_reuse_distance``: a module's parameters are not released after use when the trace
  shows them used again within this many parameter elements (e.g. the last layers of forward,
  needed again at once by backward), saving their second all-gather.
- Persistent parameters are always available and never released.
"""

from __future__ import annotations

import bisect
import enum
import itertools
from collections import deque
from dataclasses import dataclass

from torch import nn

from .partition import Gather, ParamStatus, Partition, ShardedParam


class TraceMode(enum.Enum):
    RECORD = "record"
    COMPLETE = "complete"
    INVALID = "invalid"


@dataclass(slots=True)
class _ParamUse:
    sp: ShardedParam
    step_id: int


_NEVER = -(10**12)


def register_external_parameter(module: nn.Module, parameter: nn.Parameter) -> None:
    """DeepSpeed's ``deepspeed.zero.register_external_parameter``: ``parameter`` (owned by
    another module) is used inside ``module``'s forward, so stage 3 gathers it for ``module``
    too. Stored where DeepSpeed stores it (``module._external_params``, keyed by id), so a model
    that registers in its ``__init__``, before any engine exists, works on either engine."""
    if not isinstance(parameter, nn.Parameter):
        raise RuntimeError("Parameter is not a torch.nn.Parameter")
    marked: dict[int, nn.Parameter] = module.__dict__.setdefault("_external_params", {})
    marked[id(parameter)] = parameter


class ParameterCoordinator:
    """Gathers a module's parameters before it runs and releases them after, per the trace."""

    def __init__(
        self,
        partition: Partition,
        *,
        prefetch_bucket_size: int,
        max_live_parameters: int,
        max_reuse_distance: int,
    ) -> None:
        self.partition = partition
        self.prefetch_bucket_size = prefetch_bucket_size
        self.max_live_parameters = max_live_parameters
        self.max_reuse_distance = max_reuse_distance
        self.mode = TraceMode.RECORD
        self.module_order: list[nn.Module] = []
        self.param_order: list[_ParamUse] = []
        self.queue: deque[_ParamUse] = deque()
        self.fetched_for: dict[ShardedParam, int] = {}
        self.step_id = 0
        self.inflight: dict[ShardedParam, Gather] = {}
        self.external: dict[nn.Module, list[ShardedParam]] = {}
        self._params_of: dict[nn.Module, list[ShardedParam]] = {}
        self.live_numel = 0
        """Gathered (padded) elements of non-persistent parameters alive now."""
        self.peak_live_numel = 0
        """Peak of ``live_numel`` since the last ``reset_peak``."""
        self.invalidations = 0
        self._ahead: set[ShardedParam] = set()
        self.ahead_numel = 0
        """Elements prefetched and not yet used by their module: the prefetch window."""
        self._uses: dict[ShardedParam, list[int]] = {}
        self._prefix: list[int] = [0]

    # -- what a module needs -----------------------------------------------------------------

    def params_of(self, module: nn.Module) -> list[ShardedParam]:
        """The module's own parameters (not its children's) plus registered external ones
        (through the engine, or ``deepspeed.zero.register_external_parameter``, which keeps
        them in ``module._external_params`` as DeepSpeed does)."""
        found = self._params_of.get(module)
        if found is None:
            own = [self.partition.by_param[p] for p in module.parameters(recurse=False)]
            # DeepSpeed's register_external_parameter stores them on the module itself.
            marked = module.__dict__.get("_external_params", {}).values()
            external = self.external.get(module, []) + [self.partition.by_param[p] for p in marked]
            found = own + [sp for sp in dict.fromkeys(external) if sp not in own]
            self._params_of[module] = found
        registered = module.__dict__.get("_external_params")
        if registered:
            extra = [self.partition.by_param[p] for p in registered.values()]
            found = found + [sp for sp in extra if sp not in found]
        return found

    def register_external_parameter(self, module: nn.Module, param: nn.Parameter) -> None:
        """``param`` (owned elsewhere) is used inside ``module``'s forward: gather it there too
        (DeepSpeed's ``register_external_parameter``; a module marked before the engine was
        built, by :func:`register_external_parameter`, is read by :meth:`params_of`)."""
        self.external.setdefault(module, []).append(self.partition.by_param[param])
        self._params_of.pop(module, None)

    def not_gathered(self, param: nn.Parameter) -> bool:
        """``param`` is partitioned and its full data is not here now."""
        sp = self.partition.by_param.get(param)
        return sp is not None and sp.status is not ParamStatus.AVAILABLE

    def fetch_external(self, module: nn.Module, param: nn.Parameter, use_id: int) -> None:
        """``module``'s forward (call ``use_id``) read ``param``, owned by another module,
        while it was not gathered (a tied head multiplied in the parent's forward), and an
        operation now uses its data: register it as external to ``module`` and gather it, as
        DeepSpeed's ``ZeROOrderedDict`` getter does at the read. ``module`` releases it with its own parameters and fetches it again for its
        backward; from the next forward on its pre-hook gathers it like any of its own."""
        sp = self.partition.by_param.get(param)
        if sp is None or sp.status is ParamStatus.AVAILABLE:
            return
        if sp not in self.params_of(module):
            self.register_external_parameter(module, param)
        sp.active_uses.add(use_id)
        self._consume_prefetched(sp)
        if sp.status is ParamStatus.NOT_AVAILABLE:
            self._gather([sp], prefetched=False)
        self._wait(sp)

    # -- fetch and release -------------------------------------------------------------------

    def fetch(self, module: nn.Module, use_id: int) -> None:
        """Make ``module``'s parameters available now, then prefetch what the trace says comes
        next. Called from the module's forward pre-hook and again before its backward."""
        params = self.params_of(module)
        if self.mode is TraceMode.RECORD:
            self.module_order.append(module)
        elif self.mode is TraceMode.COMPLETE and (
            self.step_id >= len(self.module_order) or self.module_order[self.step_id] is not module
        ):
            self._invalidate()
        for sp in params:
            sp.active_uses.add(use_id)
            self._consume_prefetched(sp)
        missing = [sp for sp in params if sp.status is ParamStatus.NOT_AVAILABLE]
        if missing:
            self._gather(missing, prefetched=False)
        for sp in params:
            self._wait(sp)
        if self.mode is TraceMode.COMPLETE:
            while self.queue and self.queue[0].step_id <= self.step_id:
                use = self.queue.popleft()
                self.fetched_for[use.sp] = max(self.fetched_for.get(use.sp, _NEVER), use.step_id)
            self._prefetch()
        self.step_id += 1

    def release(self, module: nn.Module, use_id: int) -> None:
        """``module`` is done with its parameters (after its forward, or after its backward)."""
        params = self.params_of(module)
        if self.mode is TraceMode.COMPLETE:
            to_release = self._params_to_release(params)
        else:
            to_release = set(params)
        for sp in params:
            sp.active_uses.discard(use_id)
            if sp.persistent or sp.active_uses or sp.status is not ParamStatus.AVAILABLE:
                continue
            if sp in to_release or self.live_numel > self.max_live_parameters:
                self._release(sp)

    def _params_to_release(self, params: list[ShardedParam]) -> set[ShardedParam]:
        """DeepSpeed's ``__params_to_release``: keep what the prefetcher already scanned past
        (a later use it skipped because the parameter was available) and what the trace uses
        again within ``max_reuse_distance`` elements. DeepSpeed walks the trace from here on
        each release; the same rule is read off prefix sums of the trace (O(log n))."""
        to_release = set()
        start = self.step_id
        for sp in params:
            if sp.persistent or self.fetched_for.get(sp, _NEVER) > start:
                continue
            uses = self._uses.get(sp, [])
            i = bisect.bisect_left(uses, start)
            if (
                i < len(uses)
                and self._prefix[uses[i]] - self._prefix[start] < self.max_reuse_distance
            ):
                continue  # used again within the reuse distance: keep it gathered
            to_release.add(sp)
        return to_release

    def release_all(self) -> None:
        """Wait for anything in flight and release every gathered non-persistent parameter
        (end of backward, before the optimizer changes the shards)."""
        for sp in list(self.inflight):
            self._wait(sp)
        for sp in self.partition.params:
            sp.active_uses.clear()
            if not sp.persistent and sp.status is ParamStatus.AVAILABLE:
                self._release(sp)

    def reset_step(self) -> None:
        """Start of a forward: close the previous trace (record -> complete, invalid -> record)
        and rewind the prefetch queue."""
        self.release_all()
        if self.mode is TraceMode.RECORD and self.module_order:
            self.param_order = [
                _ParamUse(sp, step_id)
                for step_id, module in enumerate(self.module_order)
                for sp in self.params_of(module)
            ]
            self._uses = {}
            for use in self.param_order:
                self._uses.setdefault(use.sp, []).append(use.step_id)
            # _prefix[k]: parameter elements of the trace's modules before step k.
            self._prefix = [
                0,
                *itertools.accumulate(
                    sum(sp.numel for sp in self.params_of(m)) for m in self.module_order
                ),
            ]
            self.mode = TraceMode.COMPLETE
        elif self.mode is TraceMode.INVALID:
            self.mode = TraceMode.RECORD
            self.module_order = []
            self.param_order = []
        self.queue = deque(self.param_order)
        self.fetched_for = {}
        self.step_id = 0

    def reset_peak(self) -> None:
        self.peak_live_numel = self.live_numel

    # -- internals ---------------------------------------------------------------------------

    def _invalidate(self) -> None:
        self.mode = TraceMode.INVALID
        self.queue.clear()
        self.fetched_for = {}
        self.invalidations += 1

    def _prefetch(self) -> None:
        if self.prefetch_bucket_size <= 0:
            return
        room = self.max_live_parameters - self.live_numel
        batch: list[ShardedParam] = []
        numel = 0
        while self.queue and self.ahead_numel + numel < self.prefetch_bucket_size:
            use = self.queue[0]
            sp = use.sp
            wanted = sp.status is ParamStatus.NOT_AVAILABLE and sp not in batch
            if wanted and numel + sp.padded_numel > room:
                break  # the live cap: leave it for its own fetch (order is preserved)
            self.queue.popleft()
            self.fetched_for[sp] = max(self.fetched_for.get(sp, _NEVER), use.step_id)
            if wanted:
                batch.append(sp)
                numel += sp.padded_numel
        if batch:
            self._gather(batch, prefetched=True)
            for sp in batch:
                self._ahead.add(sp)
            self.ahead_numel += numel

    def _consume_prefetched(self, sp: ShardedParam) -> None:
        if sp in self._ahead:
            self._ahead.discard(sp)
            self.ahead_numel -= sp.padded_numel

    def _gather(self, params: list[ShardedParam], *, prefetched: bool) -> None:
        gather = self.partition.all_gather(params, prefetched=prefetched)
        for sp in params:
            self.inflight[sp] = gather
        self.live_numel += sum(sp.padded_numel for sp in params)
        self.peak_live_numel = max(self.peak_live_numel, self.live_numel)

    def _wait(self, sp: ShardedParam) -> None:
        gather = self.inflight.pop(sp, None)
        if gather is not None:
            gather.wait()
            for other in gather.params:
                self.inflight.pop(other, None)

    def _release(self, sp: ShardedParam) -> None:
        self._consume_prefetched(sp)
        self.partition.release(sp)
        self.live_numel -= sp.padded_numel
