"""Which optimizers a plain torch loop steps, and which of them ends its step.

A loop may step more than one optimizer each iteration: recent LLM recipes step the matrices
with one (Muon) and the embeddings, norms and biases with another (AdamW); a GAN steps a
discriminator's and a generator's. torch's global optimizer hooks see every ``step()``, not
which belong to one iteration, so the iteration is read off the order they step in: the
*primary* optimizer (the first seen stepping) opens a cycle, and every ``step()`` until its next
one belongs to that cycle.

- From the first whole cycle on, O is the state of every optimizer that cycle stepped, and the
  Hello names them all (``SGD+AdamW``) with their state elements for the prediction (before, O
  was the primary's alone: an AdamW over the embeddings was missing from it).
- Once two cycles in a row stepped the same optimizers in the same order, the step ends when
  the cycle's last optimizer's ``step()`` returns (before, the primary's did, and the second
  optimizer's ``step()`` fell into the next step's time). A loop that steps its second
  optimizer only some iterations keeps the primary's end: one step an iteration still.

The first step is the primary's alone (no cycle is known yet): its report counts what the
primary holds, and the Hello is said again once the cycle is known (:attr:`version`).
"""

from __future__ import annotations

import weakref
from typing import Any

TAKE_OVER_AFTER = 8
"""Steps another optimizer takes, with the primary idle, before it ends the steps (a GAN's two
optimizers alternate and never reach it; a critic stepping five times per generator step, even
counted twice under a GradScaler, does once and then keeps the steps)."""
MAX_CYCLE = 64
"""Optimizer steps one cycle records (a critic's five and a generator's one fit)."""


class OptimizerCycle:
    """The loop's optimizers, held by weak reference (the attach keeps none alive)."""

    def __init__(self) -> None:
        self._primary: Any = None
        self._others = 0
        """Steps other optimizers took since the primary one last did."""
        self._cycle: list[Any] = []
        """Weakrefs of the optimizers that stepped since the primary's last ``step()`` began,
        the primary first."""
        self._ender: Any = None
        """Weakref of the optimizer whose ``step()`` ends a step: the last of the newest whole
        cycle (None: the primary)."""
        self._stepping: tuple[Any, ...] = ()
        """Weakrefs of the optimizers the newest whole cycle stepped (one each, in order)."""
        self._ended = False
        """This cycle's step was ended (an optimizer stepping twice ends it once)."""
        self._shape: tuple[int, ...] = ()
        """The newest whole cycle's optimizers (ids), in the order they stepped."""
        self.version = 0
        """Bumped when the optimizers one cycle steps change: the Hello is said again."""
        self._running: list[int] = []
        """ids of the optimizers whose ``step()`` runs now, outermost first: one stepping
        inside another's (torch's ZeRO-1 steps its local optimizer, a wrapper its inner one)
        is that one's own work, not a step of the loop."""

    def begin(self, optimizer: Any) -> bool:
        """An optimizer's ``step()`` begins; True when inside another's (leave it alone). A
        step that raised never ended: the same optimizer stepping again clears the stack."""
        running, key = self._running, id(optimizer)
        if key in running:
            running.clear()
        running.append(key)
        return len(running) > 1

    def finish(self, optimizer: Any) -> bool:
        """An optimizer's ``step()`` returned; True when it ran inside another's."""
        running = self._running
        if running and running[-1] == id(optimizer):
            running.pop()
            return bool(running)
        return False

    def primary(self, optimizer: Any = None) -> Any:
        """The optimizer whose ``step()`` opens an iteration: the first one seen stepping;
        another takes over once the first is gone, or once it has stepped
        :data:`TAKE_OVER_AFTER` times with the first idle (a script that swapped its optimizer
        and still holds the old one: its steps were no longer reported at all). ``optimizer``:
        the one about to step (its steps are counted), else None (a question only)."""
        current = self._primary() if self._primary is not None else None
        if optimizer is None:
            return current
        if optimizer is current:
            self._others = 0
            return current
        self._others += 1
        if current is None or self._others >= TAKE_OVER_AFTER:
            self._primary = weakref.ref(optimizer)
            self._others = 0
            return optimizer
        return current

    def note_step(self, optimizer: Any) -> None:
        """An optimizer's ``step()`` begins (the global pre-hook, every optimizer, after
        :meth:`primary` was asked): the primary's closes the cycle before it."""
        cycle = self._cycle
        if optimizer is not self.primary():
            if cycle and len(cycle) < MAX_CYCLE:
                cycle.append(weakref.ref(optimizer))
            return
        if len(cycle) == 1 and cycle[0]() is optimizer and self._shape == (id(optimizer),):
            # A loop of one optimizer repeating its cycle: every field below would be set to
            # what it holds already (this runs cold at every step, agent/cost.py).
            self._ended = False
            return
        if cycle:
            # The last optimizer ends the step once two cycles in a row had the same shape: a
            # loop that steps its second optimizer only some iterations (every other one) keeps
            # the primary's end, one step an iteration, rather than skipping step ends. A loop
            # of one optimizer repeats its shape every step: nothing more runs for it.
            shape = tuple(id(r()) for r in self._cycle)
            stable, self._shape = shape == self._shape, shape
            self._ender = self._cycle[-1] if stable and len(shape) > 1 else None
            if not stable:
                self._members_of(self._cycle)
        self._cycle = [weakref.ref(optimizer)]
        self._ended = False

    def _members_of(self, cycle: list[Any]) -> None:
        """The optimizers a whole cycle stepped, each once in order; a change in them says the
        Hello again."""
        seen: set[int] = set()
        members = []
        for ref in cycle:
            o = ref()
            if o is not None and id(o) not in seen:
                seen.add(id(o))
                members.append(ref)
        if [r() for r in members] != [r() for r in self._stepping]:
            if self._stepping or len(members) > 1:
                self.version += 1
            self._stepping = tuple(members)

    def ends_step(self, optimizer: Any) -> bool:
        """Whether ``optimizer``'s returning ``step()`` ends this iteration's step: the cycle's
        last optimizer (the primary while none is known: until two like cycles), once a cycle."""
        ender = self._ender() if self._ender is not None else None
        if self._ended or optimizer is not (ender or self.primary()):
            return False
        self._ended = True
        return True

    def optimizers(self) -> list[Any]:
        """The live optimizers one iteration steps (the newest whole cycle's; the primary alone
        before one was seen): their state is O, their names the Hello's."""
        live = [o for o in (r() for r in self._stepping) if o is not None]
        primary = self.primary()
        if primary is not None and not any(o is primary for o in live):
            live.insert(0, primary)
        return live
