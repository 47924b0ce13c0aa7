"""Attach: profile jobs that run on engines zeroscope does not own (DeepSpeed, FSDP2, DDP, the
Hugging Face Trainer), with no change to the training script.

``zeroscope run`` puts :data:`BOOTSTRAP_DIR` first on the workers' ``PYTHONPATH``; its
``sitecustomize`` calls :func:`zeroscope.agent.attach.install.install`, which registers
post-import hooks (:mod:`.postimport`). Once ``torch.distributed`` has finished importing, the
ProcessGroup collective methods are wrapped at class level (:mod:`.collectives`) and the engines'
entry points at class level too (:mod:`.torch_loop`, :mod:`.ddp`, :mod:`.fsdp2`,
:mod:`.deepspeed_engine`, :mod:`.hf_trainer`). Each engine has a reader that turns its own state
into the same StepReport the bundled engine sends (:mod:`.session`).

When a process reports through the agent API itself (the bundled engine, or a script calling
``zeroscope.agent.api.telemetry()``), the attach stands down and restores every class it wrapped,
so nothing is counted twice. Nothing here imports the bundled engine.
"""

from __future__ import annotations

from pathlib import Path

BOOTSTRAP_DIR = Path(__file__).resolve().parent / "bootstrap"
"""The folder holding the ``sitecustomize`` that loads the attach."""

ATTACH_ENV = "ZEROSCOPE_ATTACH"
"""``0`` turns the attach off (the bootstrap still chains to other sitecustomize files)."""

HOOKS_ENV = "ZEROSCOPE_BOOTSTRAP_HOOKS"
"""Extra ``module:function`` hooks the bootstrap calls (e.g. an import alias), comma-separated."""


def pythonpath_with_bootstrap(current: str | None) -> str:
    """``PYTHONPATH`` with the bootstrap folder first (once), the user's entries kept after it."""
    import os

    entries = [p for p in (current or "").split(os.pathsep) if p and p != str(BOOTSTRAP_DIR)]
    return os.pathsep.join([str(BOOTSTRAP_DIR), *entries])
