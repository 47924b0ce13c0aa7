"""zeroscope's bootstrap, loaded by Python's ``site`` at start-up in every worker of a job
started by ``zeroscope run`` / ``zeroscope serve`` (this folder is first on ``PYTHONPATH``).

It first chains to the ``sitecustomize`` this one hides (a distribution's or the user's own),
then installs the attach: post-import hooks that wrap torch.distributed's ProcessGroup and the
engines' step functions once those modules have finished importing. It imports nothing heavy
itself (no torch), never raises, and does nothing at all unless ``ZEROSCOPE_COLLECTOR`` is set
(``ZEROSCOPE_ATTACH=0`` turns the attach off). ``ZEROSCOPE_BOOTSTRAP_HOOKS`` names extra
``module:function`` hooks (comma-separated) to call after it, with or without a collector.
"""

from __future__ import annotations

import importlib
import os
import sys


def _chain() -> None:
    """Import the next ``sitecustomize`` on the path, as ``site`` would have without us."""
    here = os.path.dirname(os.path.abspath(__file__))
    ours = sys.modules.pop("sitecustomize", None)
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        importlib.import_module("sitecustomize")
    except ImportError as exc:
        if exc.name != "sitecustomize":
            print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{exc!r}")
    except Exception as exc:  # what site.py does with a failing sitecustomize
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{exc!r}")
    finally:
        sys.path[:] = saved
        chained = sys.modules.pop("sitecustomize", None)
        if chained is not None:
            sys.modules["_zeroscope_chained_sitecustomize"] = chained
        if ours is not None:
            sys.modules["sitecustomize"] = ours


def _install() -> None:
    if os.environ.get("ZEROSCOPE_COLLECTOR") and os.environ.get("ZEROSCOPE_ATTACH", "1") != "0":
        try:
            from zeroscope.agent.attach.install import install

            install()
        except Exception as exc:
            print(f"zeroscope: attach disabled ({exc!r})", file=sys.stderr)
    for spec in filter(None, os.environ.get("ZEROSCOPE_BOOTSTRAP_HOOKS", "").split(",")):
        try:
            module, _, function = spec.strip().partition(":")
            getattr(importlib.import_module(module), function or "install")()
        except Exception as exc:
            print(f"zeroscope: bootstrap hook {spec} failed ({exc!r})", file=sys.stderr)


_chain()
_install()
