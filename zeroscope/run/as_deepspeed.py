"""``zeroscope run --as-deepspeed``: the job's ``import deepspeed`` gets the bundled engine.

The job's environment gets ``ZEROSCOPE_AS_DEEPSPEED=1`` and, first on ``PYTHONPATH``, the
engine's bootstrap folder (``zeroscope/engine/deepspeed/boot``), whose ``sitecustomize.py``
installs the import alias in every rank at interpreter start-up and then runs whatever
``sitecustomize`` it shadows. Only the job's processes see it; zeroscope itself never imports
the engine (the folder is located through its import spec, which runs no engine code).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path

ENV = "ZEROSCOPE_AS_DEEPSPEED"


def boot_folder() -> Path:
    """The folder holding the alias's ``sitecustomize.py``."""
    spec = importlib.util.find_spec("zeroscope.engine")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("zeroscope.engine is not installed: --as-deepspeed needs it")
    return Path(next(iter(spec.submodule_search_locations))) / "deepspeed" / "boot"


def alias_environment(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the alias switched on for the job's processes."""
    out = dict(env)
    out[ENV] = "1"
    paths = [str(boot_folder()), *filter(None, out.get("PYTHONPATH", "").split(os.pathsep))]
    out["PYTHONPATH"] = os.pathsep.join(paths)
    return out
