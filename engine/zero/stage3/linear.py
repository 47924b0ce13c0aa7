"""A Linear whose backward keeps the *parameter*, not a view of its data.

``F.linear`` records ``weight.t()`` for backward: a view with its own reference to the
gathered storage. Releasing the parameter (``param.data = empty``) then frees nothing: every
Linear weight gathered in forward would stay alive until backward, and stage 3 would save no
memory on the layers that hold most of it. DeepSpeed avoids this the same way
(``runtime/zero/linear.py``, LinearFunctionForZeroStage3, its ``memory_efficient_linear``):
save the Parameter itself, whose data backward re-gathers, and compute the gradients by hand.

Autocast: the hand-written backward runs outside the forward's autocast region, so under
``torch.autocast`` with fp32 weights a bias-free Linear (the usual LLM layer) would multiply a
bf16/fp16 ``grad_out`` by an fp32 weight and fail. As DeepSpeed does, the Function's forward and
backward carry ``torch.amp.custom_fwd`` / ``custom_bwd`` for the input's device type, so backward
runs under the same autocast state as forward, and the output keeps the autocast dtype with a
bias too, as ``F.linear`` (stage 0) and DeepSpeed's do.
"""

from __future__ import annotations

import functools
import types
from typing import Any

import torch
from torch import nn

_AUTOCAST_DEVICES = frozenset({"cpu", "cuda", "xpu", "mps", "hpu", "mtia", "maia"})
"""Device types ``torch.amp.custom_fwd`` knows; others (meta) get the undecorated Function."""


def _forward_impl(
    ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> Any:
    ctx.save_for_backward(x, weight, bias)
    # DeepSpeed's forward, to the letter: under autocast ``addmm`` casts the bias with the
    # rest, and the in-place add keeps the matmul's dtype (``out + bias`` would promote a bf16
    # product with an fp32 bias to fp32, where ``F.linear`` and DeepSpeed give bf16).
    if bias is not None and x.dim() == 2:
        return torch.addmm(bias, x, weight.t())
    out = x.matmul(weight.t())
    if bias is not None:
        out += bias
    return out


def _backward_impl(ctx: Any, grad_out: torch.Tensor) -> Any:
    x, weight, bias = ctx.saved_tensors
    grad_x = grad_w = grad_b = None
    if ctx.needs_input_grad[0]:
        grad_x = grad_out.matmul(weight)
    if ctx.needs_input_grad[1]:
        grad_w = grad_out.reshape(-1, grad_out.shape[-1]).t().matmul(x.reshape(-1, x.shape[-1]))
    if bias is not None and ctx.needs_input_grad[2]:
        grad_b = grad_out.reshape(-1, grad_out.shape[-1]).sum(0)
    return grad_x, grad_w, grad_b


@functools.cache
def _linear_function(device_type: str) -> Any:
    """The memory-efficient Linear Function for inputs on ``device_type``."""
    forward, backward = _forward_impl, _backward_impl
    if device_type in _AUTOCAST_DEVICES:
        forward = torch.amp.custom_fwd(forward, device_type=device_type)
        backward = torch.amp.custom_bwd(backward, device_type=device_type)
    return type(
        f"_Zero3Linear_{device_type}",
        (torch.autograd.Function,),
        {"forward": staticmethod(forward), "backward": staticmethod(backward)},
    )


def _forward(self: nn.Linear, input: torch.Tensor) -> torch.Tensor:
    # ``input``: nn.Linear.forward's own parameter name, so keyword calls keep working.
    if not torch.is_grad_enabled():
        return torch.nn.functional.linear(input, self.weight, self.bias)
    return _linear_function(input.device.type).apply(input, self.weight, self.bias)


def patch_linears(root: nn.Module) -> list[nn.Linear]:
    """Give every plain ``nn.Linear`` in ``root`` (not subclasses with their own forward) the
    memory-efficient forward; returns them (for :func:`unpatch_linears`)."""
    patched: list[nn.Linear] = []
    for module in root.modules():
        if not isinstance(module, nn.Linear) or type(module).forward is not nn.Linear.forward:
            continue
        if "forward" not in module.__dict__:
            setattr(module, "forward", types.MethodType(_forward, module))  # noqa: B010
            patched.append(module)
    return patched


def unpatch_linears(modules: list[nn.Linear]) -> None:
    for module in modules:
        module.__dict__.pop("forward", None)
