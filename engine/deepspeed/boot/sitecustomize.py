"""Interpreter start-up hook for ``zeroscope run --as-deepspeed`` (this folder is first on the
job's PYTHONPATH): with ``ZEROSCOPE_AS_DEEPSPEED=1`` it aliases ``deepspeed`` to the bundled
engine's DeepSpeed surface (zeroscope/engine/deepspeed/alias.py) before the script imports
anything. Then it runs the ``sitecustomize`` that would have run without this folder (another
bootstrap, a site-wide one), so a job's own start-up hooks still work.

It must never stop the interpreter: a failure is one line on stderr.
"""

from __future__ import annotations

import importlib
import os
import sys


def _install_alias() -> None:
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
