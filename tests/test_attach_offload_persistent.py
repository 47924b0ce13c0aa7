"""DeepSpeed ZeRO-3 with parameter offload keeps its persistent parameters whole on the device.

Parameters at or under ``stage3_param_persistence_threshold`` are held whole by every rank,
beside their shard; with ``offload_param`` the shards go to the host and the whole copies stay
on the device. The Memory screen's prediction put them on the host with the shards: device P
read 0 against a measured 529KB ("new") and host P -14% (a new user's trial). Oracle: the P
DeepSpeed holds, counted by the attach from its own tensors under ``zeroscope run``
(tests/jobs/deepspeed_train.py, unchanged), against the formula with the persistent count the
Hello reports.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.attach_support import JOBS, job_env, read_trace, run_zeroscope, write_configs
from zeroscope.state import ClusterState
from zeroscope.state.prediction import predicted_memory

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CONFIG = {
    "train_micro_batch_size_per_gpu": 4,
    "zero_optimization": {
        "stage": 3,
        "stage3_param_persistence_threshold": 100,  # the biases stay whole, the weights shard
        "reduce_bucket_size": 10_000,  # (the default holds 1 GB a rank)
        "offload_param": {"device": "cpu", "pin_memory": False},
        "offload_optimizer": {"device": "cpu", "pin_memory": False},
    },
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
}


def test_persistent_parameters_are_predicted_on_the_device(tmp_path: Path) -> None:
    (config,) = write_configs(tmp_path, {"z3off": CONFIG})
    args = ["--configs", config, "--steps", "2", "--out", str(tmp_path / "zs")]
    run_zeroscope(JOBS / "deepspeed_train.py", args, job_env(), tmp_path / "t.zstrace", 800)
    for rank, seen in read_trace(tmp_path / "t.zstrace").items():
        (hello,) = seen.hellos
        assert 0 < hello.params.persistent < hello.params.total  # the case: some, not all
        state = ClusterState()
        state.ingest(hello)
        m, _ = predicted_memory(state)
        assert m is not None
        memory = seen.steps[-1].memory
        assert m.params == 2 * hello.params.persistent  # bf16, whole: 202 B here
        assert memory.params == pytest.approx(m.params, rel=0.05), rank  # DeepSpeed's padding
        assert memory.host_params == pytest.approx(m.host_params, rel=0.02), rank  # padding
