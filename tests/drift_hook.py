"""A bootstrap hook (``ZEROSCOPE_BOOTSTRAP_HOOKS=tests.drift_hook:install``) that makes one
private torch API the attach relies on disappear, named by ``ZEROSCOPE_TEST_DRIFT``, as a torch
release that renamed it would: right after ``torch.distributed`` finished importing (after the
attach installed), so the attach meets the drift where it uses the API, inside the job."""

from __future__ import annotations

import os
from typing import Any


class _EngineWithoutQueueCallback:
    """autograd's engine as torch's own backward needs it, without ``queue_callback``."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        if name == "queue_callback":
            raise AttributeError(name)
        return getattr(self._engine, name)


def _drift(_: Any) -> None:
    import torch
    from torch._C._distributed_c10d import ProcessGroup
    from torch.nn.parallel import DistributedDataParallel

    what = os.environ.get("ZEROSCOPE_TEST_DRIFT", "")
    if what == "fr_dump":
        delattr(torch._C._distributed_c10d, "_dump_fr_trace_json")
    elif what == "group_sequence":
        delattr(ProcessGroup, "_get_sequence_number_for_group")
    elif what == "ddp_logging":
        delattr(DistributedDataParallel, "_get_ddp_logging_data")
    elif what == "queue_callback":
        variable: Any = torch.autograd.Variable
        variable._execution_engine = _EngineWithoutQueueCallback(variable._execution_engine)
    elif what:
        raise ValueError(f"unknown drift {what!r}")


def install() -> None:
    from zeroscope.agent.attach import postimport

    postimport.when_imported("torch.distributed", _drift)
