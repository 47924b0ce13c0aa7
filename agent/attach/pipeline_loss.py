"""The loss of a ``torch.distributed.pipelining`` job: each micro-batch's, as its schedule computes
it on the last stage.

A plain loop's loss is the scalar the script calls ``backward()`` on (:mod:`.torch_loop`). A
pipeline schedule (``ScheduleGPipe``, ``Schedule1F1B``, the interleaved and zero-bubble ones,
torchtitan's) calls the loss function itself, once per micro-batch on the last stage, and
backpropagates with ``torch.autograd.backward``: no ``Tensor.backward`` call carries the loss,
and such a job showed "loss NA" on every step. The schedules compute every micro-batch's loss
in one method of their base class (``_PipelineSchedule._compute_loss``), wrapped here: each
loss it returns is handed to the step, as a plain loop's is (detached, read at the step end
without a sync), so the step's loss is the mean over its micro-batches, what a script printing
``sum(losses) / len(losses)`` shows. The first stages compute none: the cluster's loss is the
last stages' mean. Which stage each rank runs is read here too, once the schedules are imported
(agent/attach/pipeline_layout.py).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from . import patches, postimport
from .session import SESSION, STEP_SOURCES

SCHEDULES = "torch.distributed.pipelining.schedules"


def _ready(module: ModuleType) -> None:
    from .install import guarded
    from .pipeline_layout import PART, wrap_schedules

    guarded(PART, lambda: wrap_schedules(module))  # each rank's stage, in its Hello
    try:
        base = module._PipelineSchedule
        compute = base._compute_loss
    except AttributeError as exc:  # a torch that moved it: the schedules' losses read NA
        SESSION.lost("the loss of torch.distributed.pipelining schedules", repr(exc))
        return
    plain_loop = STEP_SOURCES["optimizer"]

    def _compute_loss(self: Any, *args: Any, **kwargs: Any) -> Any:
        loss = compute(self, *args, **kwargs)
        s = SESSION
        if s.source <= plain_loop and not s.passive:
            s.add_loss(loss)
        return loss

    _compute_loss.__doc__ = compute.__doc__
    patches.replace(base, "_compute_loss", _compute_loss)


def install() -> None:
    """Wrap the schedules' loss once the job imports them (never imported here)."""
    postimport.when_imported(SCHEDULES, _ready)
