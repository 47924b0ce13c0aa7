"""A step's dynamic loss scale, read on the sender thread: for a scaler that keeps its scale and
its inf/nan flags in tensors (``torch.amp.GradScaler``, FSDP's ``ShardedGradScaler``).

Reading those tensors on the training thread would sync a device (``.item()`` on CUDA). So a
step hands over a :class:`LossScaleReading` as its ``loss_scale`` figure: the scale in effect
for the step's backward and the scale after the scaler's update (each a
:class:`~.scalars.DeferredScalar`: on CUDA a non-blocking copy to the host), and whether the
step was skipped (known on the host when the scaler decided it there, else its ``found_inf``
tensors). The sender thread waits for them like for the loss (agent/pending.py), fills in
``loss_scale``, ``overflow`` and ``skipped``, and sends the events DeepSpeed jobs give
(agent/outbox.py):
``overflow`` (value: the scale that overflowed), ``scale_change`` (value: the new scale) and
``scale_at_minimum`` (an overflow that left the scale where it was: the scaler cannot lower it).
"""

from __future__ import annotations

from typing import Any

from .scalars import DeferredScalar
from .schema import Event


def scale_text(value: float) -> str:
    """A loss scale in an event's words, exact: powers of two whole (2097152, not Python's
    2.09715e+06, which a narrow screen cut to "2.0971"), a scale below 1 as it is."""
    return f"{value:.0f}" if value >= 1 and value == int(value) else f"{value:g}"


class LossScaleReading:
    """See the module docstring. The scales are taken as :class:`DeferredScalar` when they were
    current (a CUDA tensor's copy is queued behind the kernels that wrote it, before the
    scaler's next in-place update). ``skipped``: a bool known on the host, or the step's summed
    ``found_inf`` (nonzero = skipped)."""

    __slots__ = ("after", "before", "skipped")

    def __init__(
        self, before: DeferredScalar, after: DeferredScalar, skipped: bool | DeferredScalar
    ) -> None:
        self.before, self.after, self.skipped = before, after, skipped

    def ready(self, block: bool = False) -> bool:
        ready = self.before.ready(block) and self.after.ready(block)
        if isinstance(self.skipped, DeferredScalar):
            ready = self.skipped.ready(block) and ready
        return ready

    @property
    def scale(self) -> float | None:
        """The scale after the step (None: unreadable)."""
        return self.after.value

    @property
    def overflow(self) -> bool:
        """Inf/nan gradients, the step skipped (False when the flag was unreadable)."""
        skipped = self.skipped
        if isinstance(skipped, DeferredScalar):
            return bool(skipped.value)
        return bool(skipped)

    def events(self, rank: int, step: int, wall_ns: int) -> list[Event]:
        """The loss-scale events of this step, as DeepSpeed jobs give them."""
        out: list[Event] = []
        before, after = self.before.value, self.after.value

        def add(kind: Any, message: str, value: float | None) -> None:
            out.append(
                Event(
                    rank=rank, step=step, wall_ns=wall_ns, event=kind, message=message, value=value
                )
            )

        if self.overflow:
            at = scale_text(before) if before is not None else "NA"
            add("overflow", f"gradient overflow at loss scale {at}: step skipped", before)
            if before is not None and after == before:
                add("scale_at_minimum", f"overflow with the loss scale at {after:g}", after)
        if before is not None and after is not None and after != before:
            add("scale_change", f"loss scale {scale_text(before)} -> {scale_text(after)}", after)
        return out
