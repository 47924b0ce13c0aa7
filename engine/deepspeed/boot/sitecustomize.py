"""Interpreter start-up hook for ``zeroscope run --as-deepspeed`` (this folder is first on the
job's PYTHONPATH): with ``ZEROSCOPE_AS_DEEPSPEED=1`` it aliases ``deepspeed`` to the bundled
engine's DeepSpeed surface (zeroscope/engine/deepspeed/alias.py) before the script imports
anything. Then it runs the ``sitecustomize`` that would have run without this folder (another
bootstrap, a site-wide one), so a job's own start-up hooks still work.

DeepSpeed's own launcher (``zeroscope run --as-deepspeed --num_gpus N``: zeroscope's supervisor
of it, ``deepspeed.launcher.runner`` and ``deepspeed.launcher.launch``) is the real DeepSpeed and
keeps it: the alias is for the ranks those processes start, which inherit this folder and the
switch. The bundled engine has no ``deepspeed.launcher``.

It must never stop the interpreter: a failure is one line on stderr.
"""

from __future__ import annotations

import importlib
import os
import sys

LAUNCHER_MODULES = (
    "zeroscope.run.deepspeed_main",
    "deepspeed.launcher.runner",
    "deepspeed.launcher.launch",
)
"""``python -m`` modules that start ranks and are not one: they keep the real DeepSpeed."""


def is_launcher_process(argv: list[str]) -> bool:
    """Whether this interpreter's command line (``sys.orig_argv``) runs one of DeepSpeed's
    launcher modules (``-m MODULE`` or ``-mMODULE``)."""
    takes_value = False
    for i, arg in enumerate(argv[1:], start=1):
        if takes_value:
            takes_value = False
            continue
        if arg in ("-X", "-W"):
            takes_value = True
            continue
        if arg == "-m":
            return i + 1 < len(argv) and argv[i + 1] in LAUNCHER_MODULES
        if arg.startswith("-m"):
            return arg[2:] in LAUNCHER_MODULES
        if not arg.startswith("-"):
            return False  # a script or "-c" program runs, not a module
    return False


def _install_alias() -> None:
    if is_launcher_process(list(getattr(sys, "orig_argv", []))):
        return
    try:
        from zeroscope.engine.deepspeed.alias import install_from_env

        install_from_env()
    except Exception as exc:  # never break the user's interpreter start-up
        print(f"zeroscope: --as-deepspeed alias not installed: {exc}", file=sys.stderr)


def _chain() -> None:
    """Import the next ``sitecustomize`` on sys.path (the one this file shadows)."""
    here = os.path.dirname(os.path.abspath(__file__))
    saved_path, saved_module = list(sys.path), sys.modules.pop("sitecustomize", None)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        importlib.import_module("sitecustomize")
    except ModuleNotFoundError as exc:
        if exc.name != "sitecustomize":
            print(f"zeroscope: the next sitecustomize failed: {exc}", file=sys.stderr)
    except Exception as exc:
        print(f"zeroscope: the next sitecustomize failed: {exc}", file=sys.stderr)
    finally:
        sys.path[:] = saved_path
        if saved_module is not None:
            sys.modules["sitecustomize"] = saved_module


_install_alias()
_chain()
