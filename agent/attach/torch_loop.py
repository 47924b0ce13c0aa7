"""Plain torch training loops: step boundaries from ``optimizer.step()``, backward timing.

torch calls global optimizer hooks around every ``Optimizer.step`` (torch.optim.optimizer's
``register_optimizer_step_pre_hook`` / ``_post_hook``), whatever the optimizer class, so a loop
that owns its optimizer needs nothing else. A loop stepping several optimizers each iteration
ends its step at the last of them (:mod:`.optimizer_cycle`); with DeepSpeed or the HF Trainer in the process
a more specific step source drives the steps and these hooks stay silent.

Backward is timed around the ``Tensor.backward`` call that follows a timed forward (the wrapper
reads the loss there anyway): the phase is the call, DDP's and FSDP2's own end-of-backward
waits included. A Python hook inside autograd's engine costs ~40-60 us a step on a CPU job
(measured on an 8 x 512 MLP: any Python prehook or tensor hook, with nothing in it), about
half a percent of a small job's step, so the engine is only hooked where it must be: the first
backward after a timed forward is watched both ways, and if it did not come through
``Tensor.backward`` (a job calling ``torch.autograd.backward`` itself) the forward's output gets
a ``grad_fn`` pre-hook from then on (backward reached it: the phase starts) that queues an
autograd-engine callback (backward finished: it ends), the way DDP and FSDP find the end of
backward.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.distributed as dist

from zeroscope.agent.schema import ConfigSummary, ParamCounts

from . import collectives, patches, postimport
from .accumulation import divisor_of
from .census import Census, local_tensor, tensors_in
from .optimizer_slots import local_optimizer, optimizer_config, sharded_by
from .session import SESSION, STEP_SOURCES, EngineReader, precision_of


def optimizer_params(optimizer: Any) -> list[torch.Tensor]:
    return [p for group in getattr(optimizer, "param_groups", []) for p in group["params"]]


def world_size(group: Any = None) -> int:
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size(group))
    return 1


def data_parallel_size(params: list[torch.Tensor]) -> int:
    """The ranks a plain loop's gradients are averaged over: the world, less the ranks a DTensor
    parameter's mesh spans (tensor parallelism by ``parallelize_module``: the model is split
    over them, each holds a different part, and no gradient is reduced among them)."""
    world = world_size()
    mesh = next((m for p in params if (m := getattr(p, "device_mesh", None)) is not None), None)
    if mesh is None:
        return world
    try:
        split = int(mesh.size())
    except Exception:
        return world
    return max(1, world // split) if split > 0 and world % split == 0 else world


def learning_rate(optimizer: Any) -> float | None:
    """The first group's lr (None for an lr kept on a device: reading it would sync)."""
    try:
        lr = optimizer.param_groups[0]["lr"]
        if isinstance(lr, torch.Tensor) and lr.device.type != "cpu":
            return None
        return float(lr)
    except Exception:
        return None


class OptimizerReader(EngineReader):
    """A loop with no distributed wrapper: P, G, O are the optimizer's parameters, their
    gradients and its state."""

    kind = "torch"
    priority = 0

    def __init__(self, optimizer: Any) -> None:
        self._optimizer = weakref.ref(optimizer)

    def alive(self) -> bool:
        return self._optimizer() is not None

    def _optimizers(self) -> list[Any]:
        """The loop's optimizers (SESSION.cycle), or this reader's own before any stepped."""
        return SESSION.cycle.optimizers() or [self._optimizer()]

    def _params(self) -> list[torch.Tensor]:
        """The parameters every optimizer of the loop steps (each once)."""
        seen: set[int] = set()
        out = []
        for opt in self._optimizers():
            for p in optimizer_params(opt):
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    def _frozen(self) -> list[torch.Tensor]:
        """The known model's parameters no optimizer steps (none without a model: a bare
        loop's optimizers are all the reader sees)."""
        model = SESSION.model() if SESSION.model is not None else None
        if model is None:
            return []
        stepped = {id(p) for p in self._params()}
        return [p for p in model.parameters() if id(p) not in stepped]

    def hello(self) -> tuple[ConfigSummary, ParamCounts, str]:
        opt = self._optimizer()
        params = self._params()
        numel = sum(local_tensor(p).numel() for p in params)
        frozen = sum(local_tensor(p).numel() for p in self._frozen())
        first = local_tensor(params[0]) if params else torch.empty(0)
        shards = sharded_by(opt)
        config = ConfigSummary(
            stage=1 if shards > 1 else 0,  # torch's ZeRO-1 shards O over its group
            precision=precision_of(first.dtype),
            dp_world_size=shards if shards > 1 else data_parallel_size(params),
            **optimizer_config(self._optimizers()),
        )
        return config, ParamCounts(total=numel + frozen, trainable=numel), str(first.device)

    def layout(self) -> Any:
        return state_size(self._optimizers())

    def count_grads(self, census: Census) -> None:
        census.add("grads", (p.grad for p in self._params()))

    def count_state(self, census: Census) -> None:
        census.add("params", self._params())
        if SESSION.model is not None:
            census.add("params", self._frozen(), frozen=True)
        optimizer_state(census, self._optimizers())


def state_size(optimizers: list[Any]) -> int:
    """Entries in the optimizers' state (0 until their first step creates them; a
    ZeroRedundancyOptimizer's in its local optimizer)."""
    return sum(len(getattr(local_optimizer(o), "state", ())) for o in optimizers)


def optimizer_state(census: Census, optimizers: list[Any], *, host: bool = False) -> None:
    """O of any reader: the state of every optimizer the loop steps (SESSION.cycle.optimizers()),
    each held by its local optimizer under torch's ZeRO-1 (this rank's shard); ``host``:
    offloaded (FSDP's CPU offload steps the optimizer on the host)."""
    for optimizer in optimizers:
        if optimizer is not None:
            state = getattr(local_optimizer(optimizer), "state", {})
            census.add("optim", tensors_in(state), host=host)


def read_by(optimizer: Any) -> None:
    """A loop with no other reader is read through the optimizer that ends its steps (a new
    one when the script swapped optimizers: the old one's state is no longer the job's)."""
    s = SESSION
    reader = s.reader
    if (
        reader is None
        or not reader.alive()
        or (isinstance(reader, OptimizerReader) and reader._optimizer() is not optimizer)
    ):
        s.found(OptimizerReader(optimizer), just_built=False)
        from .plain_model import discover  # the loop's model, from the frames calling step()

        discover(optimizer)


def _pre_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    s = SESSION
    if s.passive or s.building or s.cycle.begin(optimizer):
        return  # (inside another optimizer's step(): a wrapper's own)
    primary = s.cycle.primary(optimizer)
    s.cycle.note_step(optimizer)
    if primary is not optimizer:
        return
    s.claim_source("optimizer")
    read_by(optimizer)
    _closure[0] = False  # this step() call's closure has not been evaluated yet
    _closure[1] = runs_a_micro_batch(args, kwargs)
    if s.drives("optimizer"):
        if s.phase_depth("optimizer"):  # the last step() raised: it never ended
            s.drop_phase("optimizer")
        s.before_step("optimizer")
        s.enter("optimizer")


def _post_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    s = SESSION
    if s.cycle.finish(optimizer) or s.building or not s.drives("optimizer"):
        return
    if not s.cycle.ends_step(optimizer):
        return
    s.exit("optimizer")
    s.end_step("optimizer", lr=learning_rate(s.cycle.primary()))


def first_tensor(output: Any, depth: int = 3) -> torch.Tensor | None:
    """The first tensor with a ``grad_fn`` in a forward's output (a tensor, tuple, dict or a
    ``ModelOutput``, whose first field is the loss when labels were given)."""
    if isinstance(output, torch.Tensor):
        return output if output.grad_fn is not None else None
    if depth == 0:
        return None
    items = output.values() if isinstance(output, dict) else output
    if isinstance(items, (list, tuple)) or isinstance(output, dict):
        for item in items:
            found = first_tensor(item, depth - 1)
            if found is not None:
                return found
    return None


_backward_off: list[str] = []
"""Why backward is no longer timed (empty while it is)."""


class BackwardTiming:
    """How backward is timed (see the module docstring)."""

    __slots__ = ("armed", "calls", "mode")

    def __init__(self) -> None:
        self.mode = "probe"
        """``probe`` until the first backward after a timed forward shows whether
        ``Tensor.backward`` carries it; then ``wrapper``, else ``hook``."""
        self.armed = False
        """A timed forward's output awaits its backward."""
        self.calls = 0
        """``Tensor.backward`` calls under way (a reentrant checkpoint's backward runs inside
        another)."""


_backward = BackwardTiming()


def _turn_off_backward(exc: BaseException) -> None:
    if not _backward_off:
        _backward_off.append(repr(exc))
        SESSION.lost("the backward phase", f"autograd's queue_callback failed ({exc!r})")


def timed_forward(
    forward: Any, module: Any, model: Any, inputs: tuple, kwargs: dict, label: str | None = None
) -> Any:
    """``forward(module, *inputs, **kwargs)`` as the step's forward: the phase around it, the
    model's inputs handed to the agent (tokens, FLOPs), the backward through its output timed;
    ``label`` names the collectives it issues. The engines' forward wrappers (DDP, FSDP1, a
    plain loop's model) call it once they know the call is the step's."""
    s = SESSION
    s.enter("forward")
    s.model_inputs(model, inputs, kwargs)
    log = collectives.LOG
    before = log.label
    if label is not None:
        log.label = label
    try:
        out = forward(module, *inputs, **kwargs)
    finally:
        if label is not None:
            log.label = before
        s.exit("forward")
    time_backward(out)
    return out


def time_backward(output: Any) -> None:
    """Time the backward pass that will run through ``output`` (see the module docstring)."""
    s = SESSION
    if s.tel is None or _backward_off:
        return
    t = first_tensor(output)
    if t is None or t.grad_fn is None:
        return
    state = _backward
    state.armed = True
    if state.mode == "wrapper":
        return

    def started(grad_outputs: Any) -> None:
        # Runs inside the user's backward: nothing may raise from here. The end of backward
        # is a callback queued on autograd's engine (a private API): if it is gone, backward
        # is no longer timed, said once, and backward runs on untouched.
        if state.calls:  # ``Tensor.backward`` is timing it: no hook is needed from now on
            state.mode = "wrapper"
            return
        state.mode, state.armed = "hook", False
        try:
            queue = torch.autograd.Variable._execution_engine.queue_callback
            s.enter("backward")
        except Exception as exc:
            _turn_off_backward(exc)
            return
        try:
            queue(lambda: s.exit("backward"))
        except Exception as exc:
            s.exit("backward")
            _turn_off_backward(exc)

    try:
        t.grad_fn.register_prehook(started)
    except Exception:
        s.errors += 1


_closure = [False, False]
"""Whether a loss of this step was read inside ``optimizer.step(closure)`` already, and
whether that step's closure runs a micro-batch of its own (:func:`runs_a_micro_batch`)."""

MICRO_BATCH_CLOSURES = ("lightning.", "pytorch_lightning.")
"""Modules whose closures run the step's last micro-batch: Lightning's automatic optimization
calls ``training_step`` and ``backward`` on its own for each accumulated micro-batch, then
hands the step's last one to ``optimizer.step(closure=...)`` (its ``Precision`` plugin's
``_wrap_closure``, partially applied)."""


def runs_a_micro_batch(args: Any, kwargs: Any) -> bool:
    """Whether the closure handed to ``step()`` computes a new micro-batch's loss (Lightning's,
    see :data:`MICRO_BATCH_CLOSURES`) rather than the step's loss again (LBFGS, SAM). Read from
    where the closure's code lives: the callable, a ``functools.partial``'s function, or the
    object a bound method belongs to. Never raises."""
    try:
        closure = kwargs.get("closure") if kwargs else None
        if closure is None and args:
            closure = args[0]
        if closure is None:
            return False
        func = getattr(closure, "func", closure)  # a functools.partial's function
        owner = getattr(func, "__self__", None)
        for part in (closure, func, owner):
            module = getattr(part, "__module__", None) or type(part).__module__
            if isinstance(module, str) and module.startswith(MICRO_BATCH_CLOSURES):
                return True
        return False
    except Exception:
        return False


def _a_steps_loss(s: Any) -> bool:
    """Whether the loss about to be backpropagated is one the step shows (before the first
    step too). Inside ``optimizer.step(closure)`` (the optimizer phase open) only the first
    closure evaluation's is, and only when none came before the step: it is the loss
    ``step()`` returns (LBFGS evaluates its closure many times over a line search, whose mean
    was shown), and a closure that repeats a loss already read (sharpness-aware steps) adds
    none. A closure that runs a micro-batch of its own (Lightning's, accumulating gradients)
    adds its loss to those read before the step."""
    if not s.phase_depth("optimizer"):
        return True
    if _closure[0] or (s._losses and not _closure[1]):
        return False
    _closure[0] = True
    return True


def install() -> None:
    """Global optimizer hooks and ``Tensor.backward`` (the loss of a plain loop is the scalar
    the script calls ``backward()`` on); all undone if the job reports through the API."""
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    patches.on_restore(register_optimizer_step_pre_hook(_pre_step).remove)
    patches.on_restore(register_optimizer_step_post_hook(_post_step).remove)
    # A compiled optimizer.step() (torch.compile around it) calls the hooks from its traced
    # wrapper, which Dynamo then runs eagerly (a break in its hook loop, beside torch's own
    # graph_break there); the hooks' frames and their callees are never compiled, where
    # before Dynamo compiled one more graph out of them and broke at the agent's calls.
    codes = [_pre_step.__code__, _post_step.__code__]
    postimport.when_imported(
        "torch._dynamo.eval_frame",
        lambda m: collectives.kept_out(m, codes, "around the optimizer's step"),
    )
    backward = torch.Tensor.backward
    plain_loop = STEP_SOURCES["optimizer"]

    state = _backward

    def backward_(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        s = SESSION
        if s.source <= plain_loop and not s.passive and _a_steps_loss(s):
            s.add_loss(self, divisor=divisor_of(self))
        if not state.armed or state.mode == "hook":
            out = backward(self, *args, **kwargs)
            if not state.calls:
                s.backward_done()
            return out
        state.armed = False
        state.calls += 1
        s.enter("backward")
        try:
            return backward(self, *args, **kwargs)
        finally:
            state.calls -= 1
            s.exit("backward")
            if not state.calls:
                s.backward_done()

    backward_.__doc__ = backward.__doc__
    patches.replace(torch.Tensor, "backward", backward_)
