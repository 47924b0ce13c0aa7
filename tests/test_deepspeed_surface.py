"""DeepSpeed's module surface on the engine, one process, no process group: the names of
``import zeroscope.engine as deepspeed`` and of the ``--as-deepspeed`` alias (in subprocesses,
with and without the real package importable), compared with DeepSpeed 0.19.8 where DeepSpeed
can answer without a process group."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import zeroscope.engine as deepspeed

ROOT = Path(__file__).resolve().parent.parent
BOOT = ROOT / "engine" / "deepspeed" / "boot"


def test_the_names_a_tutorial_script_uses() -> None:
    parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--deepspeed", "--deepspeed_config", "ds.json"])
    assert (args.deepspeed, args.deepspeed_config, args.deepscale_config) == (True, "ds.json", None)
    deepspeed.init_distributed()  # no torchrun environment: one rank, no process group
    assert (deepspeed.comm.get_rank(), deepspeed.comm.get_world_size()) == (0, 1)
    deepspeed.comm.barrier()
    t = torch.ones(3)
    deepspeed.comm.all_reduce(t)
    assert t.tolist() == [1.0, 1.0, 1.0]
    loader = deepspeed.utils.RepeatingLoader([1, 2])
    assert [next(loader) for _ in range(5)] == [1, 2, 1, 2, 1]
    from deepspeed.runtime.lr_schedules import VALID_LR_SCHEDULES as theirs  # the real one

    assert theirs == deepspeed.runtime.lr_schedules.VALID_LR_SCHEDULES
    from zeroscope.engine.engine import ZeroEngine

    assert deepspeed.DeepSpeedEngine is ZeroEngine
    assert deepspeed.zero.Init is deepspeed.zero.Init and callable(
        deepspeed.zero.GatheredParameters
    )
    assert deepspeed.checkpointing.checkpoint is not None


def test_clone_tensors_for_torch_save_as_deepspeed() -> None:
    from deepspeed.checkpoint.utils import clone_tensors_for_torch_save as theirs

    flat = torch.arange(10.0)
    item = {"a": flat[2:5], "b": [flat[:2], (flat[7:],)], "c": 3}
    mine, ref = deepspeed.checkpoint.utils.clone_tensors_for_torch_save(item), theirs(item)
    assert mine["c"] == ref["c"] == 3
    assert torch.equal(mine["a"], ref["a"]) and mine["a"].untyped_storage().size() == 3 * 4
    assert torch.equal(mine["b"][1][0], ref["b"][1][0])


def test_warmup_lr_defaults_to_each_groups_own_lr_as_deepspeed() -> None:
    """Bug fixed: an unset warmup_max_lr took the first group's lr for every group."""
    from deepspeed.runtime.lr_schedules import WarmupLR as Theirs

    def groups() -> Any:
        a, b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
        return torch.optim.AdamW([{"params": [a], "lr": 0.1}, {"params": [b], "lr": 0.02}])

    mine_opt, ref_opt = groups(), groups()
    mine = deepspeed.runtime.lr_schedules.WarmupLR(mine_opt, warmup_num_steps=4)
    ref = Theirs(ref_opt, warmup_num_steps=4, warmup_type="log")
    for _ in range(6):
        mine.step()
        ref.step()
        assert [g["lr"] for g in mine_opt.param_groups] == pytest.approx(
            [g["lr"] for g in ref_opt.param_groups], rel=1e-12
        )


def _tiny_engine(tmp_path: Path) -> Any:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    client = torch.optim.AdamW(model.parameters(), lr=0.5)
    schedule = torch.optim.lr_scheduler.LambdaLR(client, lambda step: 1.0 / (step + 1))
    engine, *_ = deepspeed.initialize(
        model=model,
        optimizer=client,
        config={"train_batch_size": 2, "zero_optimization": {"stage": 1}},
    )
    return engine, schedule


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")
def test_checkpoint_restores_the_lr_a_client_schedule_set(tmp_path: Path) -> None:
    """Bug fixed: a schedule the engine does not own (the Hugging Face Trainer's) does not
    re-apply its lr when reloaded; the lr of the next step has to come back with the optimizer
    (DeepSpeed restores torch's param groups). Before the fix the resumed step used the fresh
    schedule's first lr."""
    engine, schedule = _tiny_engine(tmp_path)
    x = torch.randn(2, 4)
    for _ in range(3):
        engine.backward(engine(x).sum())
        engine.step()
        schedule.step()
    saved_lr = engine.get_lr()
    assert saved_lr == [pytest.approx(0.5 / 4)]
    engine.save_checkpoint(str(tmp_path))
    fresh, fresh_schedule = _tiny_engine(tmp_path)
    fresh_schedule.load_state_dict(schedule.state_dict())
    assert fresh.get_lr() == [0.5]
    fresh.load_checkpoint(str(tmp_path))
    assert fresh.get_lr() == saved_lr


def test_initialize_refuses_two_configs_as_deepspeed() -> None:
    args = argparse.Namespace(deepspeed_config="a.json")
    with pytest.raises(ValueError, match=r"both in args\.deepspeed_config and to initialize"):
        deepspeed.initialize(args=args, model=torch.nn.Linear(2, 2), config={"train_batch_size": 1})


def test_deepspeed_pipe_names_as_deepspeed_exposes_them() -> None:
    """``deepspeed.pipe`` and ``deepspeed.runtime.pipe(.topology)`` on the surface hold every
    public name DeepSpeed 0.19.8's modules of those paths hold (read from the installed
    package), but ``DualPipeVModule``, which the status table lists as not built."""
    import importlib

    from zeroscope.engine.deepspeed.status import NOT_BUILT_MODULES
    from zeroscope.engine.parallel import pipe_module, topology

    for path in ("pipe", "runtime.pipe", "runtime.pipe.topology"):
        real = importlib.import_module(f"deepspeed.{path}")
        wanted = {
            n for n, v in vars(real).items()
            if not n.startswith("_") and isinstance(v, type) and v.__module__.startswith("deepspeed")
        }  # fmt: skip
        served: Any = deepspeed
        for part in path.split("."):
            served = getattr(served, part)
        missing = {f"deepspeed.{path}.{n}" for n in wanted if not hasattr(served, n)}
        assert missing <= set(NOT_BUILT_MODULES), (path, missing)
        assert wanted - {m.rsplit(".", 1)[1] for m in missing}, path  # some names are served
    assert deepspeed.pipe.PipelineModule is pipe_module.PipelineModule is deepspeed.PipelineModule
    assert deepspeed.pipe.LayerSpec is pipe_module.LayerSpec
    assert deepspeed.pipe.TiedLayerSpec is pipe_module.TiedLayerSpec
    topo = deepspeed.runtime.pipe.topology.PipeModelDataParallelTopology(2, 2, 2)
    assert isinstance(topo, topology.ProcessTopology)  # the class tests/test_pipe_units.py checks


# -- the --as-deepspeed alias, in fresh interpreters ---------------------------------------------

PROBE = """
import importlib.metadata, importlib.util, json, sys, os
out = {}
import deepspeed
out["file"] = deepspeed.__file__
out["version"] = importlib.metadata.version("deepspeed")
from deepspeed.runtime.lr_schedules import VALID_LR_SCHEDULES
from deepspeed.runtime.zero import partition_parameters as pp
from deepspeed.accelerator import get_accelerator
from deepspeed.ops.adam import DeepSpeedCPUAdam
from deepspeed import DeepSpeedEngine, comm
import deepspeed.comm as dist
out["same_module"] = comm is dist is sys.modules.get("zeroscope.engine.deepspeed.comm")
out["init"] = pp.Init is deepspeed.zero.Init
import deepspeed.pipe
from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
out["pipe"] = deepspeed.pipe.__file__
served = sys.modules.get("zeroscope.engine.parallel.pipe_module")  # None: the real DeepSpeed
out["pipe_same"] = served is not None and (
                    PipelineModule is served.PipelineModule is deepspeed.PipelineModule
                    and LayerSpec is served.LayerSpec and TiedLayerSpec is served.TiedLayerSpec
                    and PipeModelDataParallelTopology.__module__.startswith("zeroscope."))
import transformers.integrations.deepspeed as hf
import accelerate.utils
out["transformers_sees_it"] = hf.is_deepspeed_available()
out["accelerate_sees_it"] = accelerate.utils.is_deepspeed_available()
out["chained"] = os.environ.get("CHAINED_SITECUSTOMIZE")
out["real"] = sorted(n for n, m in sys.modules.items()
                     if "site-packages/deepspeed/" in (getattr(m, "__file__", None) or ""))
print(json.dumps(out))
"""

HIDE_REAL = """
import importlib.machinery, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "deepspeed" or name.startswith("deepspeed."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
find = importlib.machinery.PathFinder.find_distributions
importlib.machinery.PathFinder.find_distributions = staticmethod(
    lambda *a, **k: [d for d in find(*a, **k) if d.metadata["Name"] != "deepspeed"])
# after the alias (the bootstrap installed it before running this file): it answers first
at = next((i + 1 for i, f in enumerate(sys.meta_path) if type(f).__name__ == "DeepSpeedAlias"), 0)
sys.meta_path.insert(at, Block())
"""


def _probe(tmp_path: Path, *, alias: bool, hide_real: bool) -> dict[str, Any]:
    other = tmp_path / "other"
    other.mkdir(exist_ok=True)
    # a job's own sitecustomize, which the alias's bootstrap must still run
    (other / "sitecustomize.py").write_text(
        "import os\nos.environ['CHAINED_SITECUSTOMIZE'] = 'yes'\n"
        + (HIDE_REAL if hide_real else "")
    )
    paths = [str(other), str(ROOT)]
    env = {k: v for k, v in os.environ.items() if k != "ZEROSCOPE_AS_DEEPSPEED"}
    env["DS_ACCELERATOR"] = "cpu"
    if alias:
        from zeroscope.run.as_deepspeed import alias_environment

        env = alias_environment({**env, "PYTHONPATH": os.pathsep.join(paths)})
    else:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("hide_real", [False, True], ids=["deepspeed-installed", "not-installed"])
def test_as_deepspeed_alias(tmp_path: Path, hide_real: bool) -> None:
    out = _probe(tmp_path, alias=True, hide_real=hide_real)
    assert out["file"] == str(ROOT / "engine" / "deepspeed" / "__init__.py")
    assert out["version"] == "0.19.8+zeroscope"
    assert out["same_module"] and out["init"]
    # deepspeed.pipe is the engine's (engine/parallel), never the real package's module
    assert out["pipe"] == str(ROOT / "engine" / "deepspeed" / "pipe.py") and out["pipe_same"]
    assert out["transformers_sees_it"] and out["accelerate_sees_it"]
    assert out["chained"] == "yes"
    assert out["real"] == []


@pytest.mark.slow
def test_without_the_flag_deepspeed_is_deepspeed(tmp_path: Path) -> None:
    out = _probe(tmp_path, alias=False, hide_real=False)
    assert "site-packages" in out["file"] and out["version"] == "0.19.8"
    assert out["chained"] == "yes"
