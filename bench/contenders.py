"""The engine bench's contenders, one class per framework, all with ``step(idx, tgt) -> loss``
and the same model, weights, optimizer (AdamW lr 1e-3, weight decay 0.01), clipping (1.0),
precision (fp32) and batches.

A ``Spec`` names a contender and the ZeRO stage it is compared at; ``build`` turns it into a
live contender inside a rank process (torch imported there, never at bench import).

- torch: ``ddp`` (DistributedDataParallel), ``zero_redundancy`` (DDP + torch's
  ZeroRedundancyOptimizer: stage 1), ``fsdp2`` (``fully_shard`` per block then root: stage 3),
  ``fsdp2`` with ``CPUOffloadPolicy(pin_memory=False)`` (stage 3, everything on the host).
- ``zeroscope`` and ``deepspeed``: the same ds_config per stage, given to each engine.
  Buckets of DDP's default size (25 MiB) with overlap_comm on, so gradient reductions are
  issued from backward hooks the way DDP's are (DeepSpeed's default one 5e8 bucket would wait
  for the whole backward).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parent.parent
LR, WEIGHT_DECAY, CLIP = 1e-3, 0.01, 1.0
DDP_BUCKET = 25 * 2**20 // 4
"""Elements per gradient bucket for both engines: torch DDP's default bucket_cap_mb (25 MiB) of
fp32, so every contender reduces in buckets of the same size. Override with the environment
variable ZEROSCOPE_BENCH_BUCKET (elements): small buckets mean more collectives, and on gloo each
costs ~1 ms of latency (docs/bench.md)."""


@dataclass(frozen=True, slots=True)
class Spec:
    name: str
    family: Literal["torch", "zeroscope", "deepspeed"]
    stage: str
    """The comparison group: "0", "1", "2", "3", "2+offload", "3+offload"."""
    kind: str = ""
    """For torch: ddp, zero_redundancy, fsdp2. "aa": a second copy of the stage's zeroscope
    contender, an A/A control whose ratio to the first is this run's noise floor."""


def specs(families: set[str]) -> list[Spec]:
    """Every contender of the families asked for, grouped by stage."""
    out = [
        Spec("ddp", "torch", "0", "ddp"),
        Spec("zeroscope s0", "zeroscope", "0"),
        Spec("zeroscope s0, 2nd copy (A/A)", "zeroscope", "0", "aa"),
        Spec("deepspeed s0", "deepspeed", "0"),
        Spec("zero_redundancy", "torch", "1", "zero_redundancy"),
        Spec("zeroscope s1", "zeroscope", "1"),
        Spec("deepspeed s1", "deepspeed", "1"),
        Spec("zeroscope s2", "zeroscope", "2"),
        Spec("deepspeed s2", "deepspeed", "2"),
        Spec("fsdp2", "torch", "3", "fsdp2"),
        Spec("zeroscope s3", "zeroscope", "3"),
        Spec("deepspeed s3", "deepspeed", "3"),
        Spec("zeroscope s2+offload", "zeroscope", "2+offload"),
        Spec("deepspeed s2+offload", "deepspeed", "2+offload"),
        Spec("fsdp2+cpu_offload", "torch", "3+offload", "fsdp2"),
        Spec("zeroscope s3+offload", "zeroscope", "3+offload"),
        Spec("deepspeed s3+offload", "deepspeed", "3+offload"),
    ]
    return [s for s in out if s.family in families]


def load_demo_gpt() -> Any:
    """examples/train_gpt.py's TinyGPT class (the demo model), loaded from its file."""
    path = ROOT / "examples" / "train_gpt.py"
    spec = importlib.util.spec_from_file_location("zeroscope_bench_train_gpt", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.TinyGPT


def build_model(shape: dict[str, Any], device: str = "cpu") -> Any:
    import torch

    torch.manual_seed(0)
    model = load_demo_gpt()(
        shape["vocab"], shape["block"], shape["width"], shape["layers"], shape["heads"]
    )
    return model.to(device)


def ds_config(spec: Spec, psi: int, batch: int) -> dict[str, Any]:
    """One DeepSpeed config for both engines at this spec's stage."""
    stage = int(spec.stage[0])
    bucket = int(os.environ.get("ZEROSCOPE_BENCH_BUCKET", DDP_BUCKET))
    zero: dict[str, Any] = {
        "stage": stage,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": bucket,
        "allgather_bucket_size": bucket,
    }
    if stage == 3:
        zero.update(stage3_prefetch_bucket_size=bucket, stage3_param_persistence_threshold=1000)
    if spec.stage.endswith("+offload"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
        if stage == 3:
            zero["offload_param"] = {"device": "cpu", "pin_memory": False}
    optimizer: dict[str, Any] = {
        "type": "AdamW",
        "params": {"lr": LR, "weight_decay": WEIGHT_DECAY},
    }
    if spec.family == "deepspeed" and "offload" not in spec.stage:
        optimizer["params"]["torch_adam"] = True  # FusedAdam is a CUDA op; this is AdamW
    return {
        "train_micro_batch_size_per_gpu": batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": CLIP,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        "optimizer": optimizer,
        "zero_optimization": zero,
    }


class TorchContender:
    def __init__(self, spec: Spec, shape: dict[str, Any], world: int) -> None:
        import torch
        from torch.nn.parallel import DistributedDataParallel

        device = shape.get("device", "cpu")
        self.model = build_model(shape, device)
        if spec.kind == "fsdp2":
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

            mesh = init_device_mesh(str(device), (world,))
            kw: dict[str, Any] = {"mesh": mesh}
            if spec.stage.endswith("+offload"):
                kw["offload_policy"] = CPUOffloadPolicy(pin_memory=False)
            for block in self.model.blocks:
                fully_shard(block, **kw)
            fully_shard(self.model, **kw)
            self.forward: Any = self.model
        else:
            self.forward = DistributedDataParallel(self.model, gradient_as_bucket_view=True)
        params = self.model.parameters()
        if spec.kind == "zero_redundancy":
            from torch.distributed.optim import ZeroRedundancyOptimizer

            self.opt: Any = ZeroRedundancyOptimizer(
                params, optimizer_class=torch.optim.AdamW, lr=LR, weight_decay=WEIGHT_DECAY
            )
        else:
            self.opt = torch.optim.AdamW(params, lr=LR, weight_decay=WEIGHT_DECAY)

    def step(self, idx: Any, tgt: Any) -> float:
        import torch

        loss = self.forward(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), CLIP)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    def model_state(self) -> int | None:
        return None  # counted for the engine only (its own exact report)


class ZeroscopeContender:
    def __init__(self, spec: Spec, shape: dict[str, Any], world: int) -> None:
        from zeroscope.engine.api import initialize

        model = build_model(shape)
        self.psi = sum(p.numel() for p in model.parameters())
        cfg = ds_config(spec, self.psi, shape["batch"])
        self.engine, *_ = initialize(model=model, config=cfg)

    def step(self, idx: Any, tgt: Any) -> float:
        loss = self.engine(idx, tgt)
        self.engine.backward(loss)
        self.engine.step()
        return float(loss.detach())

    def model_state(self) -> int | None:
        """P + G + O as the engine reports them (host parts included)."""
        m = self.engine.strategy.memory()
        return int(m.params + m.grads + m.optim + m.host_params + m.host_grads + m.host_optim)


class DeepSpeedContender:
    def __init__(self, spec: Spec, shape: dict[str, Any], world: int) -> None:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed

        model = build_model(shape)
        psi = sum(p.numel() for p in model.parameters())
        cfg = ds_config(spec, psi, shape["batch"])
        self.engine, *_ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=cfg, dist_init_required=False
        )

    def step(self, idx: Any, tgt: Any) -> float:
        loss = self.engine(idx, tgt)
        self.engine.backward(loss)
        self.engine.step()
        return float(loss.detach())

    def model_state(self) -> int | None:
        return None


def build(spec: Spec, shape: dict[str, Any], world: int) -> Any:
    cls = {"torch": TorchContender, "zeroscope": ZeroscopeContender}.get(
        spec.family, DeepSpeedContender
    )
    return cls(spec, shape, world)


def deepspeed_available() -> bool:
    return importlib.util.find_spec("deepspeed") is not None
