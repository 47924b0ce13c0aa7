"""Hugging Face ``Trainer``: a callback, added to every Trainer as it is built, ends the steps.

The Trainer runs on an engine underneath (DeepSpeed with ``TrainingArguments(deepspeed=...)``,
DDP when distributed, a plain optimizer otherwise); that engine's reader reports the memory,
and the header names both (``hf-trainer+deepspeed``). Step boundaries come from the callback's
``on_step_end`` (once per optimizer step, after gradient accumulation), unless DeepSpeed is
underneath: its ``engine.step()`` is then the boundary (it also carries the loss scale and the
skipped steps). The loss of a step is what ``training_step`` returned, summed over the
micro-batches (each already divided by the accumulation steps, as the Trainer logs it).
"""

from __future__ import annotations

import weakref
from types import ModuleType
from typing import Any

from . import patches
from .losses import mean_loss
from .session import SESSION
from .torch_loop import learning_rate

_losses: list[Any] = []
_lr: list[float | None] = [None]
"""The lr of the step under way, read before its optimizer step (the Trainer moves its
scheduler on between the optimizer step and ``on_step_end``)."""
_events: set[str] = set()
"""The Trainer events seen since the last step end (each step must call them all)."""


def _step_loss() -> Any:
    """The sum of the step's micro-batch losses (a device tensor stays on the device: it is
    read later without a sync)."""
    losses = [(x, float(len(_losses))) for x in _losses]
    _losses.clear()
    return mean_loss(losses)


def install(module: ModuleType) -> None:
    """Wrap ``Trainer`` (``module`` is ``transformers.trainer``)."""
    from transformers.trainer_callback import TrainerCallback

    class ZeroscopeCallback(TrainerCallback):
        """Added by zeroscope's attach: reports each optimizer step (see zeroscope.agent.attach)."""

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            # resume_from_checkpoint: the state was loaded; the steps go on from its count
            # (under DeepSpeed, the engine's load_checkpoint says the same).
            steps = getattr(state, "global_step", 0)
            if SESSION.drives("hf-trainer") and isinstance(steps, int) and steps > 0:
                SESSION.number_steps_from(steps + 1)

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            SESSION.begin_step("hf-trainer")

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            _events.add("pre")
            _lr[0] = learning_rate(kw.get("optimizer"))
            SESSION.before_step("hf-trainer")
            if SESSION.drives("hf-trainer"):
                SESSION.enter("optimizer")

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if SESSION.drives("hf-trainer"):
                SESSION.exit("optimizer")

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            loss = _step_loss()
            s = SESSION
            if "pre" not in _events:  # a release that stopped calling it: said, not guessed
                s.lost(
                    "the HF Trainer's optimizer phase",
                    "the Trainer ended a step without calling on_pre_optimizer_step",
                )
            seen = set(_events)
            _events.clear()
            if s.drives("hf-trainer"):
                s.end_step(
                    "hf-trainer",
                    loss=loss,
                    lr=_lr[0] if "pre" in seen else learning_rate(kw.get("optimizer")),
                    samples=int(args.per_device_train_batch_size)
                    * int(args.gradient_accumulation_steps),
                )

    trainer_cls = module.Trainer
    init, training_step = trainer_cls.__init__, trainer_cls.training_step
    evaluate: Any = getattr(trainer_cls, "evaluate", None)  # the eval phase only: gone, not timed

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        s = SESSION
        if s.passive:
            return
        try:
            s.frontend = "hf-trainer"
            s.claim_source("hf-trainer")
            training = self.args
            s.frontend_config = {
                "micro_batch_size": int(training.per_device_train_batch_size),
                "gradient_accumulation_steps": int(training.gradient_accumulation_steps),
                "gradient_clipping": float(training.max_grad_norm or 0.0),
            }
            self.add_callback(ZeroscopeCallback())
            if getattr(self, "model", None) is not None:
                s.model = weakref.ref(self.model)
        except Exception:
            s.errors += 1

    def training_step_(self: Any, *args: Any, **kwargs: Any) -> Any:
        loss = training_step(self, *args, **kwargs)
        if SESSION.drives("hf-trainer"):
            _losses.append(loss)
        return loss

    def evaluate_(self: Any, *args: Any, **kwargs: Any) -> Any:
        # The evaluation between two steps (eval_strategy) is the next step's "eval" phase,
        # whatever runs it (a DDP model is evaluated unwrapped, out of DDP's forward): it read
        # as that step's data loading (0.39 s of "data" in a 0.40 s step).
        s = SESSION
        if s.passive or s.tel is None:
            return evaluate(self, *args, **kwargs)
        with s.phase("eval"):
            return evaluate(self, *args, **kwargs)

    __init__.__doc__ = init.__doc__
    training_step_.__doc__ = training_step.__doc__
    patches.replace(trainer_cls, "__init__", __init__)
    patches.replace(trainer_cls, "training_step", training_step_)
    if callable(evaluate):
        evaluate_.__doc__ = evaluate.__doc__
        patches.replace(trainer_cls, "evaluate", evaluate_)
