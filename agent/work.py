"""The model's work per step: tokens from the inputs handed to the model's forward, model
FLOPs counted with torch's own formulas as the step runs (agent/flops.py), and the peak MFU divides by (agent/peak.py).

Tokens: each micro-batch's ``input_ids`` (or the forward's first tensor) of shape
[batch, seq] (token ids) or [batch, seq, hidden] (embedded sequences) gives batch x seq
positions; an ``attention_mask`` of that shape, where handed in, leaves the padding out (its
sum is taken as a tensor and read on the sender thread, so no device sync). Any other input
(images, feature vectors) is not a sequence: tokens are NA, and ``Work.na`` says why.

FLOPs: counting runs on one step, from the first forward of the step to its ``step_end``
(every micro-batch, forward and backward; off from each backward's return to the next forward,
:meth:`WorkMeter.pause`), under agent/flops.py's dispatch mode: it counts the
matmul, convolution and attention kernels with torch's own formulas as they run and runs every
op as called (torch's FlopCounterMode does not: it swaps some fused kernels for their
decompositions, which moved a Llama's gradients; agent/flops.py says which). Later steps with
the same input shapes reuse the count; a step with new shapes is counted again, at most
``MAX_COUNTS`` times per model (each count costs Python dispatch on every op of one step),
after which a step of uncounted shapes has its FLOPs NA with the reason, unless the counted
steps fit the sequence model's form exactly (agent/flops_fit.py: dynamic padding's ever-new
lengths): then it has the fit's FLOPs, and no count is made again.

Reuse assumes a model's work follows its input shapes, which a model whose work follows its
data breaks: a masked-LM head run over the masked positions only, a mixture of experts'
routing. So the first time a counted shape comes back, that step is counted once more (one
such check per model, outside ``MAX_COUNTS``): equal, the reuse stands; different, no count is
reused from then on (steps not counted have FLOPs NA, with both counts in the reason), and
the step's own count is kept. One check can miss data that differs only sometimes.
``ZEROSCOPE_FLOPS=0`` turns the count off (FLOPs and MFU NA with that reason; tokens are still
counted).
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable
from typing import Any

import torch

from .cadence import MAX_COUNTED_FORWARDS
from .flops import StepFlops
from .flops_fit import FlopsFit
from .peak import PeakProbe
from .scalars import DeferredScalar
from .schema import Work

FLOPS_ENV = "ZEROSCOPE_FLOPS"
COMPILED_NA = (
    "FLOPs not counted: the model runs compiled code (counting inside torch.compile would "
    "change what it compiles)"
)
MAX_COUNTS = 4


_PER_MODEL = ("_shape", "_counted", "_counted_first", "_checked", "_varies", "_na_flops", "_fit")
"""The meter's state that belongs to one model (kept for it while another trains)."""


def _sequence(x: Any) -> tuple[int, int] | str:
    """(batch, seq) of a forward input that is a batch of sequences, else why it is not."""
    if not isinstance(x, torch.Tensor):
        return "the model's forward got no tensor input"
    shape = tuple(x.shape)
    if x.dtype.is_floating_point or x.dtype.is_complex:
        if len(shape) == 3:
            return shape[0], shape[1]
        return f"the model's input of shape {list(shape)} is not a batch of sequences"
    if x.dtype != torch.bool and len(shape) == 2:
        return shape[0], shape[1]
    return f"the model's input of shape {list(shape)} is not a batch of token sequences"


def first_input(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """(the input that carries the sequence, its attention mask or None)."""
    if not kwargs and args and isinstance(args[0], torch.Tensor):  # model(ids, ...): the most
        return args[0], None  # common call, kept short (it runs every micro-batch)
    batch = kwargs
    if args and isinstance(args[0], dict):  # engine(batch) with a dict of tensors
        batch = args[0]
    x = batch.get("input_ids")
    if x is None:
        x = batch.get("inputs_embeds")
    if x is None:
        x = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if x is None and args and isinstance(args[0], (list, tuple)):  # model((ids, labels)):
        x = next((a for a in args[0] if isinstance(a, torch.Tensor)), None)  # Lightning's batch
    if x is None:
        x = next((v for v in kwargs.values() if isinstance(v, torch.Tensor)), None)
    mask = batch.get("attention_mask")
    return x, mask


def model_shape(module: Any) -> tuple[int, int | None, int | None]:
    """(N, layers, hidden) for the closed form: N = elements of the weights that do matmul work
    (2-D and larger parameters outside embedding tables; a table tied to an output layer counts
    there), layers and hidden from a Hugging Face config, else the longest list of same-class
    blocks and the first embedding's width (None when not found)."""
    used: set[int] = set()
    n = 0
    for m in module.modules():
        if isinstance(m, torch.nn.Embedding):  # a lookup, no matmul (unless tied elsewhere)
            continue
        for p in m.parameters(recurse=False):
            if id(p) in used or len(getattr(p, "ds_shape", p.shape)) < 2:
                continue
            used.add(id(p))
            n += int(getattr(p, "ds_numel", p.numel()))
    config = getattr(module, "config", None)
    layers = _attr(config, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _attr(config, "hidden_size", "n_embd", "d_model")
    if layers is None:
        best = 0
        for m in module.modules():
            if isinstance(m, torch.nn.ModuleList | torch.nn.Sequential):
                kids = list(m.children())
                if len(kids) > max(1, best) and len({type(k) for k in kids}) == 1:
                    best = len(kids)
        layers = best or None
    if hidden is None:
        table = next((m for m in module.modules() if isinstance(m, torch.nn.Embedding)), None)
        hidden = None if table is None else int(table.embedding_dim)
    return n, layers, hidden


def _attr(config: Any, *names: str) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def precision_of(module: Any, device: torch.device) -> str:
    """The dtype the model's matmuls run in (autocast's where on), as the peak table names it."""
    dtype = None
    if torch.is_autocast_enabled(device.type):
        dtype = torch.get_autocast_dtype(device.type)
    if dtype is None:
        p = next((p for p in module.parameters() if p.is_floating_point()), None)
        dtype = torch.float32 if p is None else p.dtype
    if dtype == torch.bfloat16:
        return "bf16"
    if dtype == torch.float16:
        return "fp16"
    if device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return "fp32"


class WorkMeter:
    """One rank's tokens and FLOPs per step. ``inputs`` runs on the training thread at each
    forward (a few attribute reads; the count's start on the one step counted); ``take`` at
    the step's end; ``Work`` is built from what it took on the sender thread
    (:func:`work_report`)."""

    def __init__(self) -> None:
        self.peak = PeakProbe()
        self.enabled = os.environ.get(FLOPS_ENV, "1") != "0"
        self._module: Callable[[], Any] = lambda: None
        self._shape: tuple[int, int | None, int | None] | None = None
        self._positions = 0
        self._seq: int | None = None
        self._masks: list[DeferredScalar] = []
        self._shapes: list[tuple[int, ...]] = []
        self._na = ""
        self._na_flops = ""
        """Why FLOPs are not counted for this job (a compiled model), once known."""
        self._counter: Any = None
        self._counted: dict[tuple[tuple[int, ...], ...], tuple[float, int]] = {}
        self._counted_first: set[tuple[int, ...]] = set()
        self._checked = False
        """A counted shape came back and its step was counted again (one check per model)."""
        self._checking = False
        self._varies = ""
        """Why no count is reused: the check found the model's work changed with its data."""
        self._fit = FlopsFit()
        """FLOPs of shapes never counted, once the counted steps fit (agent/flops_fit.py)."""
        self.unseen = ""
        """Why no forward of the model is seen in any step (a plain loop's model that the attach
        could not watch, agent/attach/plain_model.py): each step's Work says so, where there
        was none (and its figures NA with nothing to explain)."""
        self._unseen_once = ""
        self._paused = False
        """The step's count is off between a backward's end and the next forward
        (:meth:`pause`)."""
        self._kinds: dict[Any, tuple[int, int] | str] = {}
        self._models: weakref.WeakKeyDictionary[Any, tuple[Any, ...]] = weakref.WeakKeyDictionary()
        """Each model trained before the current one: its counts, kept for when it is back."""
        self.errors = 0

    def inputs(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], step: int) -> None:
        """One micro-batch about to enter ``module``'s forward. A forward with autograd off
        (``torch.no_grad()``, ``inference_mode()``: an evaluation between training steps
        through the same model) trains nothing: its tokens are not the step's."""
        if not torch.is_grad_enabled():
            return
        try:
            if self._paused:  # the step's next micro-batch: counted on
                self._paused = False
                if self._counter is not None:
                    self._counter.__enter__()
            if self._module() is not module:  # another model (a script may train several)
                if self._shapes:  # the step is its first model's (a GAN's D after its G)
                    return
                self._switch(module)
            x, mask = first_input(args, kwargs)
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else ()
            kind = (x.dtype, shape) if shape else None
            seq = self._kinds.get(kind)  # what a shape and dtype are, judged once
            if seq is None:
                seq = _sequence(x)
                if kind is not None and len(self._kinds) < 64:
                    self._kinds[kind] = seq
            if isinstance(seq, str):
                self._na = seq
            else:
                batch, length = seq
                self._positions += batch * length
                self._seq = length
                if isinstance(mask, torch.Tensor) and tuple(mask.shape) == (batch, length):
                    self._masks.append(DeferredScalar(mask.detach().sum()))
            first = not self._shapes
            self._shapes.append(shape)
            if self._counter is not None and len(self._shapes) > MAX_COUNTED_FORWARDS:
                self._give_up(step)
            if first and self._counter is None:
                due, check = self._due(shape), self._check_due(shape)
                if (due or check) and not self._compiled(module):
                    counter = StepFlops()
                    counter.__enter__()
                    self._counter, self._checking = counter, check and not due
                    self._counted_first.add(shape)
        except Exception:
            self.errors += 1

    def pause(self) -> None:
        """A backward returned: the count stops until the step's next forward (another
        micro-batch) or its end. What runs between is no model's work (the optimizer's ops:
        Muon's Newton-Schulz matmuls were counted as the model's), and a compiled
        ``optimizer.step()`` must not run under the counter's dispatch mode: pushed outside the
        compiled call and popped inside it, the job crashed at its next op ("Hit Python
        dispatch key but no arguments had PyInterpreter")."""
        counter = self._counter
        if counter is None or self._paused:
            return
        try:
            counter.__exit__(None, None, None)
            self._paused = True
        except Exception:
            self.errors += 1

    def _switch(self, module: Any) -> None:
        """The step's model is ``module``: its counts come back if it was seen before, so two
        models trained in turn (a GAN, two tasks) are not each counted anew every step, which
        ran every op of every step under the counter (a DDP GAN 2.5x slower). Kept by a weak
        reference, not id(): a later model may reuse a freed one's id (an FSDP2 GPT after a DDP
        Llama got the Llama's cached count that way)."""
        old = self._module()
        if old is not None:
            with contextlib.suppress(TypeError):  # a module that cannot be weakly keyed
                self._models[old] = tuple(getattr(self, name) for name in _PER_MODEL)
        self._module = weakref.ref(module)
        kept = None
        with contextlib.suppress(TypeError):
            kept = self._models.pop(module, None)
        if kept is not None:
            for name, value in zip(_PER_MODEL, kept, strict=True):
                setattr(self, name, value)
            return
        self._shape = model_shape(module)
        self._counted, self._counted_first = {}, set()
        self._checked, self._varies = False, ""
        self._na_flops, self._fit = "", FlopsFit()
        if self.enabled:  # the peak only divides counted FLOPs: no probe without them
            p = next(module.parameters(), None)
            device = p.device if p is not None else torch.device("cpu")
            self.peak.start(torch, device, precision_of(module, device))

    def _give_up(self, step: int) -> None:
        """The count has run past :data:`MAX_COUNTED_FORWARDS` forwards of ``step``: off, and no
        count is made again (FLOPs NA with the reason). A count lasts until its step's end, so a
        loop whose end zeroscope never sees (no hooked optimizer: a manual SGD update) kept
        every op of the run under the counter's Python dispatch: a DDP MLP ran 60 % slower."""
        counter, self._counter = self._counter, None
        self._checking = False
        paused, self._paused = self._paused, False
        self._na_flops = (
            f"FLOPs not counted: step {step} ran {MAX_COUNTED_FORWARDS:,} forwards without a "
            "step end seen (a loop whose optimizer zeroscope does not hook?), so counting "
            "stopped rather than slow the job"
        )
        if not paused:
            counter.__exit__(None, None, None)

    def _compiled(self, module: Any) -> bool:
        """torch.compile is in play: a dispatch mode around a compiled call changes what
        Dynamo compiles (a per-block ``module.compile()`` under FSDP2 compiled no frame at
        all), so such a model's FLOPs are NA, never counted at that price. Checked only while a
        count is due (a walk over the modules, once per new shape). Not Dynamo's global frame
        counters: they count every compile in the process, whoever did it."""
        if any(
            getattr(m, "_compiled_call_impl", None) is not None or hasattr(m, "_orig_mod")
            for m in module.modules()
        ):
            self._na_flops = COMPILED_NA
            return True
        return False

    def _due(self, first_shape: tuple[int, ...]) -> bool:
        return (
            self.enabled
            and not self._na_flops
            and self._counter is None
            and first_shape not in self._counted_first
            and len(self._counted) < MAX_COUNTS
            and not self._fit.usable
        )

    def _check_due(self, first_shape: tuple[int, ...]) -> bool:
        """A counted shape is back: count it again, once (see the module docstring). Only the
        step's first shape is known here: with gradient accumulation a later micro-batch may
        make the step's shapes new after all (dynamic padding), a count but no check, so the
        check stays due, within the counts' budget plus one."""
        return (
            self.enabled
            and not self._na_flops
            and not self._checked
            and first_shape in self._counted_first
            and len(self._counted) <= MAX_COUNTS
        )

    def not_seen_this_step(self, why: str) -> None:
        """This step's forwards ran unseen (before the model was known): its Work says ``why``."""
        self._unseen_once = why

    def take(self, step: int) -> tuple[Any, ...] | None:
        """The step's raw facts (None when no forward was seen in it), and a fresh step."""
        flops: tuple[float, int] | None = None
        counter, self._counter = self._counter, None
        checking, self._checking = self._checking, False
        paused, self._paused = self._paused, False
        key = tuple(self._shapes)
        if counter is not None:
            try:
                if not paused:
                    counter.__exit__(None, None, None)
                if counter.failed:
                    self._na_flops = (
                        f"FLOPs not counted: torch's formula for {counter.failed} failed"
                    )
                else:
                    flops = (float(counter.total), step)
                    if checking:
                        self._compare(self._counted.get(key), flops)
                    self._counted[key] = flops
                    self._fit.add(key, flops[0], step)
            except Exception:
                self.errors += 1
        once, self._unseen_once = self._unseen_once, ""
        if not self._shapes:
            why = once or self.unseen
            if not why:
                return None
            peak, source = self.peak.figure()
            return (None, None, [], None, why, peak, source, None, False)
        fitted = False
        if flops is None and not self._varies:
            flops = self._counted.get(key)
            if flops is None and not self._na_flops and self._fit.usable:
                predicted = self._fit.predict(key)
                if predicted is not None:
                    flops, fitted = (predicted, self._fit.verified_step), True
        why = self._na
        if flops is None and (self._na_flops or self._varies):
            why = why or self._na_flops or self._varies
        if flops is None:
            why = why or (
                "FLOPs not counted: the count is off (ZEROSCOPE_FLOPS=0)"
                if not self.enabled
                else self._fit.refused or self._uncounted_why()
            )
        peak, source = self.peak.figure()
        masks = self._masks if len(self._masks) == len(self._shapes) else []
        facts = (self._positions if not self._na else None, self._seq, masks, flops, why)
        self._positions, self._seq, self._masks, self._shapes, self._na = 0, None, [], [], ""
        return (*facts, peak, source, self._shape, fitted)

    def _uncounted_why(self) -> str:
        if len(self._counted) >= MAX_COUNTS:
            return f"FLOPs not counted for these input shapes ({MAX_COUNTS} counts spent)"
        return (
            "FLOPs not counted for these input shapes: a count starts at a step's first "
            "micro-batch, whose shape had been counted, and a later one's was new"
        )

    def _compare(self, before: tuple[float, int] | None, now: tuple[float, int]) -> None:
        """The check's count against the earlier count of the same shapes (none: the step's
        shapes were new after all, and nothing was checked)."""
        if before is None:
            return
        self._checked = True
        if before[0] != now[0]:
            self._varies = (
                "FLOPs not counted: this model's work changes with its data at equal input "
                f"shapes (step {before[1]} counted {before[0]:.4g}, step {now[1]} {now[0]:.4g}), "
                "so no count is reused"
            )


def work_report(facts: tuple[Any, ...]) -> Work:
    """The step's Work from ``take``'s facts (on the sender thread: the masks' sums are read
    here, after the step's end, so reading them waits for nothing on the training thread)."""
    positions, seq, masks, flops, why, peak, source, shape, fitted = facts
    tokens = positions
    if tokens is not None and masks:
        sums = []
        for m in masks:
            m.ready(block=True)
            sums.append(m.value)
        tokens = int(sum(sums)) if all(v is not None for v in sums) else positions
    n, layers, hidden = shape if shape is not None else (None, None, None)
    return Work(
        tokens=tokens,
        positions=positions,
        seq_len=seq,
        flops=None if flops is None else flops[0],
        flops_step=0 if flops is None else flops[1],
        flops_fit=fitted,
        peak_flops=peak,
        peak_source=source,
        dense_params=n,
        layers=layers,
        hidden=hidden,
        na=why,
    )
