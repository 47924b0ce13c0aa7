"""Activation memory (A): bytes autograd saves for backward, counted exactly by hooks.

``torch.autograd.graph.saved_tensors_hooks`` sees every tensor an op saves for its backward,
on CPU and GPU alike. The pack hook wraps the tensor in a small :class:`_Saved` handle that lives
exactly as long as autograd keeps the saved tensor: when backward consumes it (or the graph is
dropped) the handle dies and its bytes are released. Live bytes rise through forward and fall
through backward; the step's A is their peak.

What counts: the *storage* behind each saved tensor, once, however many tensors (views, the
same tensor saved by two ops) share it, because that is the memory actually held. Parameters
(``nn.Parameter`` or views of one) are skipped: they are P, reported by the engine.

Only the innermost pair of saved-tensor hooks applies, so counting hooks entered inside a
script's own (``torch.autograd.graph.save_on_cpu``, a compression hook) would silently switch
the script's off. The counter's hooks therefore hand each tensor on to the hooks that were
active when they were entered, and unpack through them: the count is of what autograd saved,
the script's hooks still decide how it is kept.

Under ``torch.compile`` the hooks are entered outside the compiled region (the attach's
compiled-model wrapper, the engine's forward) and AOTAutograd's compiled forward saves its
tensors through them: A is what the compiled graph saves. The hooks themselves run outside
Dynamo (:func:`_out_of_dynamo`): they add no graph break and no compiled frame.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import torch

from .cost import now_ns


class BlockSplit:
    """What the marked blocks saved during one counted window."""

    __slots__ = ("count", "inputs", "inside", "largest")

    def __init__(self) -> None:
        self.count = self.inputs = self.inside = self.largest = 0


class _Saved:
    """Pack-hook handle: holds what is kept for autograd (the tensor, or what the enclosing
    hooks packed it into) and releases its storage's bytes on death."""

    __slots__ = ("counter", "key", "tensor", "unpack")

    def __init__(
        self, counter: ActivationCounter, tensor: Any, key: Any, unpack: Any = None
    ) -> None:
        self.counter = counter
        self.tensor = tensor
        self.key = key
        self.unpack = unpack

    def __del__(self) -> None:
        if self.key is not None:
            self.counter._release(self.key)


def _is_parameter(t: torch.Tensor) -> bool:
    base = t._base if t._base is not None else t
    return isinstance(base, torch.nn.Parameter)


class ActivationCounter:
    """Live and peak bytes of distinct storages saved for backward, and (when the engine marks
    its repeated blocks) how much of it each block saved: what activation checkpointing of those
    blocks would keep (their inputs) and drop (what they save inside)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._refs: dict[Any, list[int]] = {}  # storage key -> [handles alive, nbytes]
        self.live = 0
        self.peak = 0
        self._depth = 0
        self._block_start = 0
        self._blocks = BlockSplit()
        self.cost: Any = None
        """The agent's SeamCost: the hooks' own time is the agent's time on the training
        thread too (agent/cost.py)."""

    def hooks(self) -> _DelegatingHooks:
        """A fresh context manager that counts what is saved while it is entered, passing each
        tensor on to the saved-tensor hooks already active then (see the module docstring)."""
        return _DelegatingHooks(self)

    def _pack(self, tensor: torch.Tensor, outer: Any = None) -> Any:
        kept: Any = tensor
        unpack = None
        if outer is not None:  # the enclosing hooks' work is theirs, not counted as ours
            kept, unpack = outer[0](tensor), outer[1]
        t0 = now_ns()
        saved = self._saved(tensor, kept, unpack)
        cost = self.cost
        if cost is not None:
            cost.ns += now_ns() - t0
        return saved

    def _saved(self, tensor: torch.Tensor, kept: Any, unpack: Any) -> _Saved:
        try:
            if _is_parameter(tensor):
                return _Saved(self, kept, None, unpack)
            storage = tensor.untyped_storage()
            key = (tensor.device, storage.data_ptr())
            nbytes = storage.nbytes()
        except Exception:  # e.g. tensor subclasses without storage: not counted, never fatal
            return _Saved(self, kept, None, unpack)
        with self._lock:
            entry = self._refs.get(key)
            if entry is None:
                self._refs[key] = [1, nbytes]
                self.live += nbytes
                if self.live > self.peak:
                    self.peak = self.live
            else:
                entry[0] += 1
        return _Saved(self, kept, key, unpack)

    @staticmethod
    def _unpack(saved: _Saved) -> torch.Tensor:
        return saved.tensor if saved.unpack is None else saved.unpack(saved.tensor)

    def _release(self, key: Any) -> None:
        t0 = now_ns()
        with self._lock:
            entry = self._refs.get(key)
            if entry is not None:
                entry[0] -= 1
                if entry[0] == 0:
                    del self._refs[key]
                    self.live -= entry[1]
        cost = self.cost
        if cost is not None:
            cost.ns += now_ns() - t0

    def block_enter(self, input_bytes: int) -> None:
        """A repeated block's forward starts (nested blocks count as part of the outer one)."""
        with self._lock:
            self._depth += 1
            if self._depth == 1:
                self._block_start = self.live
                self._blocks.inputs += input_bytes

    def block_exit(self) -> None:
        with self._lock:
            if self._depth == 1:
                saved = max(self.live - self._block_start, 0)
                b = self._blocks
                b.count, b.inside, b.largest = b.count + 1, b.inside + saved, max(b.largest, saved)
            self._depth = max(self._depth - 1, 0)

    def take_blocks(self) -> BlockSplit:
        """The block split since the previous call (then reset)."""
        with self._lock:
            split, self._blocks, self._depth = self._blocks, BlockSplit(), 0
        return split

    def take_peak(self) -> int:
        """The peak since the previous call; the next window starts from what is live now."""
        with self._lock:
            peak, self.peak = self.peak, self.live
        return peak


class _DelegatingHooks(torch.autograd.graph.saved_tensors_hooks):
    """The counter's saved-tensor hooks, chained to the pair active when entered."""

    def __init__(self, counter: ActivationCounter) -> None:
        self._counter = counter
        super().__init__(counter._pack, counter._unpack)

    def __enter__(self) -> None:
        outer = torch._C._autograd._top_saved_tensors_default_hooks(False)
        counter = self._counter
        if outer is not None:
            self.pack_hook = lambda tensor: counter._pack(tensor, outer)
        else:
            self.pack_hook = counter._pack
        if "torch._dynamo" in sys.modules:
            self.pack_hook, self.unpack_hook = _out_of_dynamo(self.pack_hook, self.unpack_hook)
        super().__enter__()


def _out_of_dynamo(pack: Any, unpack: Any) -> tuple[Any, Any]:
    """``pack`` and ``unpack``, and the handles' release, kept out of Dynamo.

    Autograd calls the hooks from C++ for every tensor an op saves, also while a compiled
    model runs (its graph-break code, AOTAutograd's compiled forward): with Dynamo's frame
    callback on, each such call would be a frame Dynamo tries to compile, and the counter's
    clock reads and storage pointers are graph breaks there. ``torch.compiler.disable`` runs
    them as plain Python (Dynamo neither counts nor traces those frames). Only once the job
    imported Dynamo: importing it costs seconds.
    """
    disable = torch.compiler.disable
    if not _released_out_of_dynamo:
        _released_out_of_dynamo.append(True)
        _Saved.__del__ = disable(_Saved.__del__)  # type: ignore[method-assign]
    return disable(pack), disable(unpack)


_released_out_of_dynamo: list[bool] = []
