"""A bootstrap hook (``ZEROSCOPE_BOOTSTRAP_HOOKS=tests.drift_hook:install``) that makes one
private torch API the attach relies on disappear, named by ``ZEROSCOPE_TEST_DRIFT``, as a torch
release that renamed it would: right after ``torch.distributed`` finished importing (after the
attach installed), so the attach meets the drift where it uses the API, inside the job.

``ZEROSCOPE_TEST_DRIFT=a,b`` gives each rank its own (rank 0 ``a``, rank 1 ``b``): the attach is
per process, so one 2-rank launch tests two drifts, each rank's console line and trace saying
its own (a launch is seconds of imports; the training is noise beside them)."""

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


def _mine() -> str:
    """This process's drift: its rank's entry of the comma-separated list (rank 0 outside a
    rank: torchrun's own process)."""
    drifts = os.environ.get("ZEROSCOPE_TEST_DRIFT", "").split(",")
    return drifts[int(os.environ.get("RANK", "0")) % len(drifts)]


def _drift(_: Any) -> None:
    import torch
    from torch._C._distributed_c10d import ProcessGroup
    from torch.nn.parallel import DistributedDataParallel

    what = _mine()
    if what == "fr_dump":
        delattr(torch._C._distributed_c10d, "_dump_fr_trace_json")
    elif what == "group_sequence":
        delattr(ProcessGroup, "_get_sequence_number_for_group")
    elif what == "ddp_logging":
        delattr(DistributedDataParallel, "_get_ddp_logging_data")
    elif what == "queue_callback":
        variable: Any = torch.autograd.Variable
        variable._execution_engine = _EngineWithoutQueueCallback(variable._execution_engine)
    elif what in RENAMED:
        # The reader's list names what the engine no longer has: a release that renamed it
        # (the engine runs on under its new name, which no reader knows).
        from zeroscope.agent.attach import private_api

        kind, name = RENAMED[what]
        private_api.INSTANCE[kind] = (*private_api.INSTANCE[kind], name)
    elif what and what not in LATER:
        raise ValueError(f"unknown drift {what!r}")


RENAMED = {
    "fsdp2_param": ("fsdp2.param", "_sharded_param_data_before_a_rename"),
    # What DeepSpeed 0.19 really did: ZeRO-1/2's ipg_buffer became ipg_buckets.
    "deepspeed_zero12": ("deepspeed.zero12", "ipg_buffer"),
}
LATER = {"hf_pre_optimizer_step"}
"""Drifts in packages imported after torch.distributed (installed by their own hooks)."""


def _trainer_drift(module: Any) -> None:
    """A transformers release that no longer calls ``on_pre_optimizer_step``."""
    if _mine() == "hf_pre_optimizer_step":
        module.CallbackHandler.on_pre_optimizer_step = lambda self, args, state, control: control


def install() -> None:
    from zeroscope.agent.attach import postimport

    postimport.when_imported("torch.distributed", _drift)
    postimport.when_imported("transformers.trainer_callback", _trainer_drift)
