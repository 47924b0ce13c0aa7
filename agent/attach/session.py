"""One attach session per process: which engine was found, when a step ends, what it held.

Engines are found as they are built (a DeepSpeedEngine, an FSDP2 module, a DDP wrapper, a
Trainer, or a plain torch optimizer stepping). Each has an :class:`EngineReader`; the most
specific one found is the one whose state is reported (DeepSpeed > FSDP2 > DDP > optimizer).
Step boundaries come from one *step source*, the most specific seen: DeepSpeed's
``engine.step()`` at an accumulation boundary, else the Trainer's ``on_step_end``, else a
loss scaler's ``update()`` (:mod:`.grad_scaler`), else the first torch optimizer's
``step()``. Sources of lower rank stay silent, so a step is never counted twice.

Memory (exact, from the engine's own tensors, :mod:`.census`) is counted on steps 1-3, on any
step whose optimizer state changed size, and then every 10th step no sooner than a second after
the last count and than the last count's cost allows within 0.1 % of the time (the activation
count's rule, agent/cadence.py: a census of a small model's ~50 tensors costs ~1 ms of a ~30 ms
CPU step); ``ZEROSCOPE_MEMORY_EVERY=N`` counts exactly every N-th step instead. P and O are
counted after the optimizer step, G just before it (most engines free their gradients in
``step()``). Steps in between repeat the latest count: engine state has the same size step after
step, and walking thousands of parameters every step would cost more than the agent's whole
overhead budget (agent/cost.py). A repeated count says the step it was made on
(``MemoryBytes.census_step``), so no view shows it as that step's own.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import torch

from zeroscope.agent.cadence import ActivationCadence
from zeroscope.agent.schema import EventKind, MemoryBytes

from . import collectives, patches
from .accumulation import unscaled
from .census import Census
from .engine_reader import EngineReader as EngineReader
from .engine_reader import precision_of as precision_of
from .losses import LOSSES_HELD, mean_loss, read_host_losses, readable_scalar
from .optimizer_cycle import OptimizerCycle

STEP_SOURCES = {"optimizer": 0, "grad-scaler": 1, "hf-trainer": 2, "deepspeed": 3}
MEMORY_EVERY_ENV = "ZEROSCOPE_MEMORY_EVERY"

MAX_PHASES_PER_STEP = 16_384
"""Phases one step may time (4,096 micro-batches' forward, backward and more). Each phase is a
raw mark held until the step ends, and each forward's inputs a shape: a loop whose step end the
attach never sees (gradients computed with no ``optimizer.step()``: a probe, an evaluation with
autograd on, an optimizer that is not a ``torch.optim.Optimizer``) would otherwise hold more of
them at every iteration, for the whole run. Past it, phases and inputs are not recorded until a
step ends (said once); the loop itself is untouched."""


class AttachSession:
    """See the module docstring. All entry points are called from the engines' wrappers and
    never raise: a failure is counted in ``errors`` and the job goes on."""

    def __init__(self) -> None:
        self.tel: Any = None
        self.passive = False
        """The process reports through the agent API itself: the attach stood down."""
        self.reader: EngineReader | None = None
        self.source = -1
        self.frontend = ""
        """A wrapper around the engine (``hf-trainer``), named before it in the header."""
        self.frontend_config: dict[str, Any] = {}
        """What the frontend knows of the batch and clipping (the HF Trainer's arguments), put
        in the Hello of an engine that does not (DDP, FSDP2, a plain optimizer): without it
        they read as the schema's defaults (micro-batch 1, no clipping)."""
        self.errors = 0
        self.steps = 0
        self.building = 0
        """Engines under construction now: DeepSpeed's runs its optimizer's ``step()`` to make
        the optimizer state (the fp16 and bf16 optimizers, with zero gradients), which is no
        training step; the plain loop's optimizer hooks leave it alone."""
        self._hello_for: tuple[int, str, int] | None = None
        self.cycle = OptimizerCycle()
        """Which optimizers a loop steps, which of them ends a step (optimizer_cycle.py)."""
        self.model: Any = None
        """A weakref to the model a frontend (the HF Trainer) trains: a plain optimizer's
        reader counts its parameters that the optimizer does not step (frozen) in P."""
        self._losses: list[Any] = []
        self.grad_norm: Any = None
        """The step's gradient norm as its loop's clipping returned it (grad_clip.py)."""
        self._divisor: float | None = None
        """The divisor every micro-batch loss of the step was handed in with (None: no loss
        yet; 0: they differ)."""
        self._depth: dict[str, int] = {}
        self._open: dict[str, Any] = {}
        self._grads: tuple[int | None, int, int] = (None, 0, 0)
        """G (device, host) counted before this step's optimizer step, and by which reader (its
        id); None, or another reader than the one reporting the step (a plain loop's step 1,
        whose reader is found at its end; a second Trainer's, counted by the first's optimizer,
        which read 0), or a count that failed: NA, and the next step is counted again (once)."""
        self._g_missed = False
        self._memory = MemoryBytes()
        self._layout: Any = None
        self.parallel: Any = None
        """This rank's place in a pipeline (a ``ParallelLayout``; agent/attach/pipeline_layout.py),
        carried in its Hello; None: plain data parallelism as far as the attach knows."""
        self._lost: dict[str, str] = {}
        """Parts of the attach that turned themselves off, and why (each said once)."""
        self._drifted: set[int] = set()
        """Readers (by id) whose engine lacks a private attribute they read: their P/G/O are
        NA rather than a count that silently misses what was renamed."""
        self.memory_cadence = ActivationCadence.from_env(MEMORY_EVERY_ENV)
        """When P/G/O are counted (bench/attach_overhead.py sets its clock)."""
        self._due: tuple[int, bool] = (0, False)
        """The step whose census was decided, and the decision (G and P/O share it)."""
        self._census_ns = 0
        """The training thread's CPU in this step's census so far."""
        self._phases = 0
        """Phases timed in this step so far (at most :data:`MAX_PHASES_PER_STEP`)."""
        self._first_step = 0
        """A resumed job's own number of its next step, said before the agent started."""
        self._census_at = 0
        """The step (its report's number) whose census ``_memory`` holds; 0: none yet."""

    # -- discovery ---------------------------------------------------------------------------

    def found(self, reader: EngineReader, *, just_built: bool = True) -> None:
        """An engine was found; it becomes the reported one if none more specific is alive.
        ``just_built``: found as it was constructed (not mid-step, like a plain loop's
        optimizer): what its construction issued (broadcasts of the initial weights, stage-3
        partitioning) belongs to no training step and is dropped."""
        if self.passive:
            return
        current = self.reader
        if current is None or not current.alive() or reader.priority >= current.priority:
            self.reader = reader
            if just_built:
                collectives.LOG.clear()
        self._check_private(reader)
        self._start()

    def number_steps_from(self, first: int) -> None:
        """The job resumed from a checkpoint and numbers its next step ``first`` (DeepSpeed's
        ``global_steps + 1`` after ``load_checkpoint``, the HF Trainer's ``global_step + 1``
        at ``on_train_begin``): the reports number the steps as the job's own log does."""
        if self.passive:
            return
        if self.tel is None:
            self._first_step = first
            return
        try:
            self.tel.number_steps_from(first)
        except Exception:
            self.errors += 1

    def _check_private(self, reader: EngineReader) -> None:
        try:
            gone = reader.private_missing()
        except Exception as exc:
            gone = [f"unreadable ({exc!r})"]
        if gone:
            self._drifted.add(id(reader))
            self.lost(f"{reader.kind}'s memory accounting (P, G, O)", f"{', '.join(gone)} gone")

    def claim_source(self, source: str) -> None:
        """A step source exists in this process (the most specific one drives steps)."""
        self.source = max(self.source, STEP_SOURCES[source])

    def drives(self, source: str) -> bool:
        return not self.passive and STEP_SOURCES[source] == self.source

    def _start(self) -> None:
        if self.tel is not None or self.passive:
            return
        from zeroscope.agent import api
        from zeroscope.agent.live import LiveTelemetry
        from zeroscope.agent.startup import start_agent

        tel = start_agent()
        if isinstance(tel, LiveTelemetry):
            tel._collectives = collectives.LOG  # collectives come from the class-level wrappers
            collectives.RECORDER.wake = tel._outbox.wake
        api.set_telemetry(tel)
        self.tel = tel
        if self._first_step:
            self.number_steps_from(self._first_step)
        if self.parallel is not None:
            tel.layout(self.parallel)
        for part, reason in self._lost.items():
            tel.event("info", f"zeroscope lost {part}: {reason}")

    def set_layout(self, layout: Any) -> None:
        """This rank's pipeline stage (and replica) is known: in its Hello from now on (sent
        again if it went out already, as the agent API's ``layout`` does)."""
        if layout == self.parallel:
            return
        self.parallel = layout
        if self.tel is not None and not self.passive:
            try:
                self.tel.layout(layout)
            except Exception:
                self.errors += 1

    def lost(self, part: str, reason: str) -> None:
        """A part of the attach turned itself off (a private torch API moved, a recorder is
        off): the job goes on untouched; said once, on the run's console and, once the agent
        runs, on the Log screen."""
        if part in self._lost:
            return
        self._lost[part] = reason
        notice(f"{part}: not seen ({reason}); the job runs on unchanged")
        if self.tel is not None and not self.passive:
            try:
                self.tel.event("info", f"zeroscope lost {part}: {reason}")
            except Exception:
                self.errors += 1

    def stand_down(self) -> None:
        """The job reports through the agent API itself: undo every patch, report nothing.
        An agent the attach already started is the job's from now on, under its own name."""
        self.passive = True
        if self.tel is not None:
            from zeroscope.agent.startup import ENGINE_ENV

            self.tel.engine = os.environ.get(ENGINE_ENV, "zeroscope")
        self.tel = None
        self.reader = None
        patches.restore_all()

    def begin_step(self, source: str) -> None:
        """``source`` says a step begins (an HF Trainer's ``on_step_begin``, before its first
        micro-batch's forward): step 1's time runs from there where nothing began it sooner.
        On one device the Trainer's model is found at its first optimizer step (its step 1
        forward unwatched), so step 1 began with nothing and read 0 s."""
        if self.steps or self.passive or not self.drives(source):
            return  # (only step 1 can begin with nothing: later ones run from the last end)
        self._start()
        begin = getattr(self.tel, "begin_first_step", None)
        if begin is not None:
            try:
                begin()
            except Exception:
                self.errors += 1

    # -- phases ------------------------------------------------------------------------------

    def enter(self, name: str) -> None:
        """Begin a phase (nested entries of the same phase count once)."""
        depth = self._depth.get(name, 0)
        self._depth[name] = depth + 1
        tel = self.tel
        if depth or tel is None or (name == "forward" and self._depth.get("eval")):
            return  # (an evaluation's forwards are its own: one "eval" phase around them)
        self._phases += 1
        if self._phases > MAX_PHASES_PER_STEP:
            self._too_long()
            return
        try:
            cm = tel.phase(name)
            cm.__enter__()
            self._open[name] = cm
            collectives.LOG.label = name
        except Exception:
            self.errors += 1

    def exit(self, name: str) -> None:
        depth = self._depth.get(name, 0) - 1
        self._depth[name] = max(depth, 0)
        if depth > 0:
            return
        cm = self._open.pop(name, None)
        if cm is not None:
            try:
                cm.__exit__(None, None, None)
            except Exception:
                self.errors += 1
        collectives.LOG.label = ""

    def phase_depth(self, name: str) -> int:
        """How many entries of phase ``name`` are open (0: none)."""
        return self._depth.get(name, 0)

    def drop_phase(self, name: str) -> None:
        """A phase whose end never came (an ``optimizer.step()`` that raised runs no post
        hook) is forgotten, so the next one is timed (before, every later optimizer phase
        counted as nested in it and went unseen): its start mark is taken back, and its time
        is left unattributed."""
        self._depth[name] = 0
        cm = self._open.pop(name, None)
        drop = getattr(self.tel, "drop_marks", None)
        if cm is not None and drop is not None:
            try:
                drop(cm)
            except Exception:
                self.errors += 1

    def _too_long(self) -> None:
        """This step timed :data:`MAX_PHASES_PER_STEP` phases and has not ended (said once)."""
        if self._phases == MAX_PHASES_PER_STEP + 1:
            self.lost(
                f"the phases and inputs of a step past its first {MAX_PHASES_PER_STEP:,} phases",
                f"no step end seen after {MAX_PHASES_PER_STEP:,} phases (steps end at the "
                "optimizer's step(), DeepSpeed's engine.step() or the HF Trainer's step); "
                "recorded again from the next step end",
            )

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.enter(name)
        try:
            yield
        finally:
            self.exit(name)

    def model_inputs(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A micro-batch entering the model's forward (tokens, FLOPs: agent/work.py)."""
        tel = self.tel
        if tel is not None and not self.passive and self._phases <= MAX_PHASES_PER_STEP:
            try:
                tel.model_inputs(module, args, kwargs)
            except Exception:
                self.errors += 1

    def add_loss(self, loss: Any, weight: float = 1.0, divisor: float = 1.0) -> None:
        """A micro-batch's loss (a tensor, detached here; read at the step end without a sync).
        ``weight`` undoes a scaling the caller applied (a loss already divided by the
        accumulation steps); ``divisor``: the number the script divided the loss by, undone
        at the step's end when it is the step's accumulation (agent/attach/accumulation.py)."""
        try:
            seen = self._divisor
            self._divisor = divisor if seen is None or seen == divisor else 0.0
            if isinstance(loss, torch.Tensor):
                if loss.numel() != 1:
                    return
                loss = readable_scalar(loss)
                if loss is None:  # a partial DTensor: reading it would be a collective
                    return
            losses = self._losses
            if len(losses) >= LOSSES_HELD and len(losses) % LOSSES_HELD == 0:
                read_host_losses(losses)
                if len(losses) >= 4096:  # backward() without any step ending (no engine found)
                    del losses[:2048]
            losses.append((loss, weight))
        except Exception:
            self.errors += 1

    def event(self, kind: EventKind, message: str, value: float | None = None) -> None:
        """Something the engine did now (overflow, scale change), sent at once."""
        if self.tel is not None and not self.passive:
            self.tel.event(kind, message, value)

    # -- steps -------------------------------------------------------------------------------

    def _memory_due(self) -> bool:
        """Whether this step's P/G/O are counted, decided once per step (module docstring)."""
        step = self.steps + 1
        if self._due[0] == step:
            return self._due[1]
        try:
            reader = self.reader
            changed = reader is not None and (id(reader), reader.layout()) != self._layout
        except Exception:
            self.errors += 1
            changed = False
        due = changed or self._g_missed or self.memory_cadence.due(step, False)
        self._due = (step, due)
        return due

    def backward_done(self) -> None:
        """A ``loss.backward()`` returned: the step's FLOP count pauses until the next forward
        (agent/work.py ``WorkMeter.pause``)."""
        work = getattr(self.tel, "work", None)
        if work is not None and not self.passive:
            try:
                work.pause()
            except Exception:
                self.errors += 1

    def before_step(self, source: str) -> None:
        """Just before the optimizer step of ``source``: count gradients when due."""
        reader = self.reader
        if not self.drives(source) or reader is None or id(reader) in self._drifted:
            return
        if not self._memory_due():
            return
        t0 = time.thread_time_ns()
        try:
            census = Census()
            reader.count_grads(census)
            self._grads = (census.device["grads"], census.host["grads"], id(reader))
        except Exception:
            self.errors += 1
        self._census_ns += time.thread_time_ns() - t0

    def end_step(self, source: str, **figures: Any) -> None:
        """The optimizer step of ``source`` finished: send this step's report."""
        if not self.drives(source):
            return
        tel, reader = self.tel, self.reader
        if tel is None or reader is None:
            return
        try:
            self._send(tel, reader, figures)
        except Exception:
            self.errors += 1
        self.steps += 1
        self._losses, self.grad_norm = [], None
        self._divisor = None
        self._phases = 0

    def _send(self, tel: Any, reader: EngineReader, figures: dict[str, Any]) -> None:
        engine = f"{self.frontend}+{reader.kind}" if self.frontend else reader.kind
        said = (id(reader), engine, self.cycle.version)  # again when the optimizers changed
        if self._hello_for != said:
            self._hello_for = said
            config, params, device = reader.hello()
            known = self.frontend_config
            if known and reader.kind != "deepspeed":  # DeepSpeed says its own
                config = msgspec.structs.replace(
                    config,
                    **known,
                    train_batch_size=known["micro_batch_size"]
                    * known["gradient_accumulation_steps"]
                    * config.dp_world_size,
                )
            tel.engine = engine
            tel.hello(config=config, params=params, device=device)
        if id(reader) in self._drifted:
            self._memory = MemoryBytes()  # NA: see _check_private
            self._census_at = 0
        elif self._memory_due():
            t0 = time.thread_time_ns()
            census = Census()
            reader.count_state(census)
            grads, host_grads, counted_by = self._grads
            self._grads = (None, 0, 0)
            missed = counted_by != id(reader)
            if missed:
                grads, host_grads = None, 0
            self._g_missed = missed and not self._g_missed  # one step counted again, not more
            memory = MemoryBytes(
                params=census.device["params"],
                grads=grads,
                optim=census.device["optim"],
                host_params=census.host["params"],
                host_grads=host_grads,
                host_optim=census.host["optim"],
                frozen_params=census.frozen,
            )
            reader.memory_extras(memory)
            self._memory = memory
            self._census_at = getattr(tel, "current_step", 0)
            self._layout = (id(reader), reader.layout())
            self.memory_cadence.spent((self._census_ns + time.thread_time_ns() - t0) / 1e9)
        self._census_ns = 0
        if "loss" not in figures:
            figures["loss"] = mean_loss(unscaled(self._losses, self._divisor or 1.0))
        if "grad_norm" not in figures:  # (DeepSpeed says its own)
            figures["grad_norm"] = self.grad_norm
        memory = self._memory
        if self._census_at and self._census_at != getattr(tel, "current_step", 0):
            memory = msgspec.structs.replace(memory, census_step=self._census_at)  # repeated
        tel.step_end(memory=memory, **figures)


SESSION = AttachSession()


def notice(message: str) -> None:
    """One line on stderr (the attach never raises into the job)."""
    print(f"zeroscope: {message}", file=sys.stderr)
