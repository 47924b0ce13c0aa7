"""The model FLOPs of one step, counted as its kernels run, without changing which kernels run.

torch's ``FlopCounterMode`` cannot be used as it ships for this: for every op it has no
formula for, its dispatch mode first tries the op's CompositeImplicitAutograd decomposition
(``func.decompose``) and runs that instead of the op's own kernel, so it can find matmuls
hidden inside composite ops. Most ops have no such decomposition at that level, but some do
beside a fused kernel: ``aten.silu_backward`` is one, and the decomposition (sigmoid, then
products and sums as separate ops) rounds differently from the fused CPU/CUDA kernel. A
Llama's SwiGLU MLP calls it in every layer's backward, so under FlopCounterMode the counted
step's gradients moved in their last bits, and so did every loss after it (a LoRA'd Llama on
DeepSpeed and the bundled engine: tests/test_flop_count_numerics.py finds the op).

``StepFlops`` counts with torch's own formulas (``torch.utils.flop_counter.flop_registry``:
mm, addmm, bmm, baddbmm, convolution, the attention kernels) and runs every op exactly as
called, never a decomposition: the step computes what it computes without the count, bit for
bit. What it could miss is a matmul inside a composite op that reaches the dispatch mode
undecomposed; on dense tensors the composite ops with matmuls inside (linear, matmul, einsum)
are decomposed above the mode, at the autograd key, so their mm/bmm reach it and are counted
(the counts equal FlopCounterMode's on the GPT and Llama tests).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def cpu_attention_formulas() -> dict[Any, Any]:
    """FLOP formulas for the CPU kernel of ``scaled_dot_product_attention``, which torch's
    registry counts on CUDA (flash, efficient, cuDNN) but not on CPU (it counted an HF Llama's
    attention as 0 FLOPs here): the same formulas, the attention's two batched matmuls forward
    and four backward, causal or not (as torch counts the CUDA kernels)."""
    from torch.utils import flop_counter

    aten = torch.ops.aten

    def forward(q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kw: Any) -> int:
        return int(flop_counter.sdpa_flop_count(q, k, v))

    def backward(
        grad: Any, q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kw: Any
    ) -> int:
        return int(flop_counter.sdpa_backward_flop_count(grad, q, k, v))

    # Called as torch calls its own: tensors turned into shapes by its shape_wrapper, and
    # marked raw so that a FlopCounterMode given them does not wrap them twice.
    raw = {}
    for op, formula in (
        (aten._scaled_dot_product_flash_attention_for_cpu, forward),
        (aten._scaled_dot_product_flash_attention_for_cpu_backward, backward),
    ):
        wrapped = flop_counter.shape_wrapper(formula)
        wrapped._get_raw = True
        raw[op] = wrapped
    return raw


def formulas() -> dict[Any, Any]:
    """torch's FLOP formulas by op (overload packet), with the CPU attention's added."""
    from torch.utils import flop_counter

    return {**flop_counter.flop_registry, **cpu_attention_formulas()}


class StepFlops(TorchDispatchMode):
    """A dispatch mode that adds up the FLOPs of the ops that have a formula and runs every op
    as it was called (no decomposition, no other kernel). Entered on the training thread at
    the counted step's first forward, left at its end; ``total`` is then the step's model
    FLOPs. Models that run compiled code are not counted at all (agent/work.py says why).

    Model FLOPs leave out the forward that activation checkpointing runs again in the
    backward (MFU's definition, PaLM appendix B: recomputation is hardware FLOPs, not the
    model's; an HF GPT-2 with ``gradient_checkpointing`` counted 1.32x its FLOPs without it).
    The recompute is told apart by autograd's own state, whichever checkpoint runs it (torch's
    reentrant or not, DeepSpeed's, the bundled engine's): inside a backward graph task the
    engine runs each node with grad mode off, and a checkpoint turns it on to run its forward
    again. A task whose every op ran with grad mode on is a ``create_graph`` backward (a
    gradient penalty's): its ops are the backward's own, and stay counted."""

    def __init__(self) -> None:
        super().__init__()
        self.registry = formulas()
        self.counted = 0
        """Every op's FLOPs as it ran, recomputed forwards included (hardware FLOPs)."""
        self.failed = ""
        """The op whose formula raised (the count is then NA, never short), else empty."""
        self._grad_on: dict[int, int] = {}
        """Backward graph task -> FLOPs of its ops run with grad mode on."""
        self._grad_off: set[int] = set()
        """Backward graph tasks where some op ran with grad mode off (not ``create_graph``)."""

    @property
    def recomputed(self) -> int:
        """FLOPs of the forwards activation checkpointing ran again in the backward."""
        return sum(n for task, n in self._grad_on.items() if task in self._grad_off)

    @property
    def total(self) -> int:
        """The step's model FLOPs: counted, less the recomputed forwards."""
        return self.counted - self.recomputed

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)  # the job's op: its errors are the job's own
        task = _graph_task()
        grad_on = task != -1 and torch.is_grad_enabled()
        if task != -1 and not grad_on:
            self._grad_off.add(task)
        formula = self.registry.get(getattr(func, "_overloadpacket", None))
        if formula is not None and not self.failed:
            try:  # a formula's failure must never reach the job's step
                n = int(formula(*args, **kwargs, out_val=out))
            except Exception:
                self.failed = str(func)
            else:
                self.counted += n
                if grad_on:
                    self._grad_on[task] = self._grad_on.get(task, 0) + n
        return out


_graph_task = getattr(torch._C, "_current_graph_task_id", lambda: -1)
"""The autograd engine's graph task running on this thread (-1 outside a backward). Private;
tests/test_flops_recompute.py fails on a torch without it (every backward op would then read
as outside a backward, and a recompute as the model's)."""
