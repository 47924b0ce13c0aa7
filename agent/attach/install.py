"""What the bootstrap calls: post-import hooks that install the attach piece by piece.

- ``torch.distributed`` finished importing (after the whole of ``torch``): ProcessGroup
  collective wrappers, global optimizer hooks, loss scalers, DDP and FSDP2 readers, and
  (once ``torch._dynamo`` is imported) the compiled models' forward wrapper.
- ``deepspeed`` finished importing: the DeepSpeedEngine reader (unless ``deepspeed`` is the
  bundled engine under an import alias, which reports through the agent API itself).
- ``transformers.trainer`` finished importing: the Trainer callback.

The first code to ask the agent API for its reporter (the bundled engine, a script using
``zeroscope.agent.api``) makes the attach stand down (:meth:`AttachSession.stand_down`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType

from . import postimport

_done: list[bool] = []
_claimed: list[bool] = []
"""Set when the job asked the agent API for its reporter: hooks that fire later do nothing."""


LAUNCHER_MODULES = frozenset(
    {
        "torch.distributed.run",
        "torch.distributed.launch",
        "deepspeed.launcher.runner",
        "deepspeed.launcher.launch",
        "accelerate.commands.launch",
        "accelerate.commands.accelerate_cli",
        "zeroscope.run.torchrun_main",  # ``zeroscope run``'s supervised torchrun
        "zeroscope.run.deepspeed_main",  # and DeepSpeed's runner
    }
)
LAUNCHER_SCRIPTS = frozenset({"torchrun", "deepspeed", "accelerate"})


def launcher_process(argv: list[str] | None = None) -> bool:
    """Whether this interpreter runs a launcher (torchrun, DeepSpeed's runner and launch,
    ``accelerate launch``) rather than a rank: ``argv`` is the interpreter's own command line
    (``sys.orig_argv``, set before the bootstrap runs). A launcher creates no process group, and
    what it holds in its environment it may print: DeepSpeed's launch.py logs every variable
    whose name holds "NCCL", so the timing switch set there was a line of the job's output
    that a run without zeroscope does not have. Each rank sets it in its own process."""
    args = list(sys.orig_argv if argv is None else argv)[1:]
    while args and args[0].startswith("-") and args[0] not in ("-m", "-c"):
        flag = args.pop(0)  # the interpreter's own flags (-u, -X dev, ...)
        if flag in ("-X", "-W") and args:
            args.pop(0)
    if len(args) >= 2 and args[0] == "-m":
        return args[1] in LAUNCHER_MODULES
    return bool(args) and args[0].rsplit("/", 1)[-1] in LAUNCHER_SCRIPTS


def _stand_down() -> None:
    _claimed.append(True)
    session = sys.modules.get(__package__ + ".session")
    if session is not None:  # only loaded once torch was: nothing to undo before that
        session.SESSION.stand_down()


def torch_parts() -> list[tuple[str, Callable[[], object]]]:
    """The parts installed once ``torch.distributed`` is imported, in order, each with the name
    said if it fails (bench/attach_overhead.py leaves them out one at a time to split a cost)."""
    from . import (
        collectives,
        compiled,
        ddp,
        device_mesh,
        fsdp1,
        fsdp2,
        grad_clip,
        grad_scaler,
        pipeline_loss,
        spawned,
        torch_loop,
    )

    return [
        ("collectives issued from Python", collectives.install),
        ("plain torch loop steps", torch_loop.install),
        ("torch.amp GradScaler steps", grad_scaler.install),
        ("the gradient norm of torch.nn.utils clipping", grad_clip.install),
        ("DDP", ddp.install),
        ("FSDP2", fsdp2.install),
        ("FSDP", fsdp1.install),
        ("collectives of DeviceMesh groups (DTensor)", device_mesh.install),
        ("the loss of torch.distributed.pipelining schedules", pipeline_loss.install),
        ("compiled models", compiled.install),
        ("ranks the job spawns itself", spawned.install),
    ]


def _torch_ready(_: ModuleType) -> None:
    if _claimed:
        return
    for part, install_part in torch_parts():
        guarded(part, install_part)


def guarded(part: str, install_part: Callable[[], object]) -> bool:
    """Install one part of the attach; if it fails half-way (a torch internal moved), undo
    what it had patched, say so once, and go on without it. Returns whether it installed."""
    from . import patches

    mark = patches.checkpoint()
    try:
        install_part()
        return True
    except Exception as exc:
        patches.rollback(mark)
        from .session import SESSION

        SESSION.lost(part, f"its install failed ({exc!r})")
        return False


def _deepspeed_ready(module: ModuleType) -> None:
    if _claimed:
        return
    engine = getattr(module, "DeepSpeedEngine", None)
    if engine is None or not str(getattr(engine, "__module__", "")).startswith("deepspeed."):
        return  # the bundled engine under an import alias: it reports for itself
    from . import deepspeed_engine

    guarded("DeepSpeed", lambda: deepspeed_engine.install(module))


def _trainer_ready(module: ModuleType) -> None:
    if _claimed:
        return
    from . import hf_trainer

    guarded("the HF Trainer", lambda: hf_trainer.install(module))


def install() -> None:
    """Register the hooks (once per process)."""
    if _done:
        return
    _done.append(True)
    from zeroscope.agent import api

    from .flight_recorder import configure_environment

    if not launcher_process():
        configure_environment()  # before the job creates its process groups
        from zeroscope.agent.exit_status import STATUS

        STATUS.install()  # before the script runs: ``from sys import exit`` gets the wrapper

    api.on_claim(_stand_down)
    postimport.when_imported("torch.distributed", _torch_ready)
    postimport.when_imported("deepspeed", _deepspeed_ready)
    postimport.when_imported("transformers.trainer", _trainer_ready)
