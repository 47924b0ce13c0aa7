"""Tensor-parallel collectives as the agent sees them (label ``"tp"``).

DTensor issues its collectives through ``torch.distributed._functional_collectives``
(``all_reduce`` for a row-parallel output or a column-parallel input gradient, and
``reduce_scatter_single`` / ``all_gather_single`` for sequence-sharded layouts); placement code
looks them up on that module at call time, so wrapping the module's functions sees every one.
Installed once a tensor-parallel engine is built; each call reports to the process's current
reporter, and costs one attribute check when nothing is watching.

A functional collective returns at once and is waited for where its result is first used, which
inside DTensor is the very next op; the wrapper waits at issue instead (``wait_tensor``: on
CPU/gloo the same host wait a moment earlier, on CUDA a stream dependency, no host sync), so the
time between issue and completion can be reported. Results are unchanged.
"""

from __future__ import annotations

import functools
from typing import Any

from zeroscope.agent import api

_WRAPPED = ("all_reduce", "reduce_scatter_single", "all_gather_single")
_OPS = {
    "all_reduce": "all_reduce",
    "reduce_scatter_single": "reduce_scatter",
    "all_gather_single": "all_gather",
}


class _Pending:
    """A functional collective's result as a Waitable."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor

    def wait(self) -> Any:
        from torch.distributed import _functional_collectives as funcol

        return funcol.wait_tensor(self.tensor)


def install_tp_probe(group_size: int) -> None:
    """Report every functional collective of this process to the agent (idempotent)."""
    from torch.distributed import _functional_collectives as funcol

    if getattr(funcol, "_zeroscope_probe", False):
        return
    for name in _WRAPPED:
        original = getattr(funcol, name)
        setattr(funcol, name, _wrap(original, _OPS[name], group_size))
    funcol._zeroscope_probe = True  # type: ignore[attr-defined]


def _wrap(original: Any, op: Any, group_size: int) -> Any:
    @functools.wraps(original)
    def collective(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(tensor, *args, **kwargs)
        tel = api.telemetry()
        if not tel.enabled:
            return out
        try:
            size = out if op == "all_gather" else tensor  # nccl-tests: the full size
            nbytes = size.numel() * size.element_size()
            handle = tel.collective(
                _Pending(out), op=op, nbytes=nbytes, group_size=group_size, label="tp"
            )
            handle.wait()
        except Exception:
            pass  # telemetry never stops the step
        return out

    return collective
