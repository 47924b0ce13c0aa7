"""Models, data and the one-process reference for the 3D-parallel tests.

Every case trains the same layer list (residual MLP blocks whose ``fc1``/``fc2`` carry the
tensor-parallel plan, a lambda between blocks, optionally a bias-free linear tied between the
first and last layer: DeepSpeed ties only ``tied_weight_attr``, so a bias would be two separate
parameters there) from seeded builds (``seed_layers``: layer i is built right after seeding
``BASE_SEED + i``, as DeepSpeed's PipelineModule does). The reference builds the same layers
in one process as an ``nn.Sequential`` (a tied module appears twice: autograd sums its
gradients and ``clip_grad_norm_`` counts it once) and trains the same global batch with
``torch.optim.AdamW`` and ``clip_grad_norm_``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

BASE_SEED = 4321
WIDTH, HIDDEN = 8, 16
LR = 1e-2
TP_PLAN = {
    "autotp_size": 2,
    "partition_config": {
        "layer_specs": [
            {"patterns": [r"fc1\.(weight|bias)$"], "partition_type": "column"},
            {"patterns": [r"fc2\.weight$"], "partition_type": "row"},
        ]
    },
}


class Block(nn.Module):
    """A residual MLP block: column-parallel fc1, row-parallel fc2, a replicated LayerNorm."""

    def __init__(self, width: int = WIDTH, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.fc2(torch.relu(self.fc1(x))))


def _tanh(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x)


def layer_specs(blocks: int = 4, tied: bool = False) -> list[Any]:
    """The PipelineModule layers: [tied proj?] block, lambda, block, ... [tied proj?]."""
    from zeroscope.engine.parallel.pipe import LayerSpec, TiedLayerSpec

    specs: list[Any] = []
    if tied:
        specs.append(TiedLayerSpec("proj", nn.Linear, WIDTH, WIDTH, bias=False))
    for i in range(blocks):
        specs.append(LayerSpec(Block))
        if i % 2 == 0:
            specs.append(lambda x: _tanh(x))
    if tied:
        specs.append(TiedLayerSpec("proj", nn.Linear, WIDTH, WIDTH, bias=False))
    return specs


class _Call(nn.Module):
    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


def reference_model(specs: list[Any]) -> nn.Sequential:
    """The same layers built in one process with the same per-layer seeds."""
    from zeroscope.engine.parallel.pipe import LayerSpec, TiedLayerSpec
    from zeroscope.engine.parallel.pipe_module import set_random_seed

    tied: dict[str, nn.Module] = {}
    modules: list[nn.Module] = []
    for i, spec in enumerate(specs):
        set_random_seed(BASE_SEED + i)
        if isinstance(spec, TiedLayerSpec):
            modules.append(tied.setdefault(spec.key, spec.build()))
        elif isinstance(spec, LayerSpec):
            modules.append(spec.build())
        else:
            modules.append(_Call(spec))
    return nn.Sequential(*modules)


def microbatches(n: int, mb: int = 2, seed: int = 11) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(mb, WIDTH, generator=g), torch.randn(mb, WIDTH, generator=g)) for _ in range(n)
    ]


@dataclass
class Case:
    name: str
    pp: int = 2
    tp: int = 1
    stage: int = 1
    schedule: str = "1f1b"
    virtual: int = 1
    placement: str = "loop"
    tied: bool = False
    partition: str = "uniform"
    gas: int = 4
    steps: int = 3
    extra: dict[str, Any] = field(default_factory=dict)

    def ds_config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            "train_micro_batch_size_per_gpu": 2,
            "gradient_accumulation_steps": self.gas,
            "steps_per_print": 0,
            "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.0}},
            "zero_optimization": {"stage": self.stage, "stage3_param_persistence_threshold": 0},
            "pipeline": {"schedule": self.schedule},
            **self.extra,
        }
        if self.tp > 1:
            cfg["tensor_parallel"] = TP_PLAN
        return cfg


def run_case(case: Case, world: int) -> dict[str, Any]:
    """Inside a rank: train ``case`` (a PipelineModule when pp > 1, else engine(x) /
    backward / step on an nn.Sequential); the data-parallel mean loss and the engine's global
    gradient norm of each step."""
    import torch.distributed as dist

    import zeroscope.engine.api as deepspeed
    from tests.recorder import RecordingTelemetry
    from zeroscope.agent.api import set_telemetry
    from zeroscope.engine.parallel.pipe import PipelineModule, PipeModelDataParallelTopology

    recorder = RecordingTelemetry()
    set_telemetry(recorder)
    dp = world // (case.pp * case.tp)
    specs = layer_specs(tied=case.tied)
    if case.pp > 1:
        net = PipelineModule(
            specs,
            topology=PipeModelDataParallelTopology(num_pp=case.pp, num_mp=case.tp, num_dp=dp),
            loss_fn=nn.MSELoss(),
            partition_method=case.partition,
            seed_layers=True,
            base_seed=BASE_SEED,
            virtual_stages=case.virtual,
            stage_placement=case.placement,  # type: ignore[arg-type]
        )
        engine, *_ = deepspeed.initialize(model=net, config=case.ds_config())
        # DeepSpeed's ranks and sizes: the job's for global_rank/world_size, ZeRO's group's for
        # dp_world_size (a merge once gave the data-parallel group's for all three).
        assert (engine.global_rank, engine.world_size) == (dist.get_rank(), dist.get_world_size())
        assert engine.dp_world_size == dp
        rank_dp = engine.parallel.coords.dp
        stream = iter(microbatches(case.gas * case.steps * dp)[rank_dp::dp])
        losses, norms = [], []
        for _ in range(case.steps):
            losses.append(float(engine.train_batch(stream)))
            norms.append(float(engine.get_global_grad_norm()))
        executed = [f"{a.stage}{a.kind}{a.microbatch}" for a in recorder.pipelines[-1].actions]
        return {
            "losses": losses,
            "norms": norms,
            "tp": _tp_ops(recorder),
            "plan": list(recorder.layouts[-1].plan),
            "executed": executed,
        }
    model = reference_model(specs)
    engine, *_ = deepspeed.initialize(model=model, config=case.ds_config())
    rank_dp = engine.parallel.coords.dp if hasattr(engine, "parallel") else dist.get_rank()
    stream = iter(microbatches(case.gas * case.steps * dp)[rank_dp::dp])
    losses, norms = [], []
    for _ in range(case.steps):
        total = torch.zeros(1)
        for _ in range(case.gas):
            x, y = next(stream)
            loss = nn.functional.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()
            total += loss.detach() / case.gas
        dist.all_reduce(total, group=engine.comm.group)
        losses.append(float(total) / dp)
        norms.append(float(engine.get_global_grad_norm()))
    return {"losses": losses, "norms": norms, "tp": _tp_ops(recorder)}


def _tp_ops(recorder: Any) -> list[dict[str, int]]:
    """Per step: the tensor-parallel collectives reported (label ``tp``), counted by op."""
    out = []
    for step in recorder.steps:
        counts: dict[str, int] = {}
        for c in step.collectives:
            if c.label == "tp":
                counts[c.op] = counts.get(c.op, 0) + 1
        out.append(counts)
    return out


def reference_run(case: Case, world: int) -> dict[str, list[float]]:
    """One process, the whole global batch per step (every replica's micro-batches): losses
    and the pre-clipping global gradient norms."""
    dp = world // (case.pp * case.tp)
    model = reference_model(layer_specs(tied=case.tied))
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    data = microbatches(case.gas * case.steps * dp)
    streams = [iter(data[d::dp]) for d in range(dp)]
    losses, norms = [], []
    for _ in range(case.steps):
        opt.zero_grad()
        total = 0.0
        for stream in streams:
            for _ in range(case.gas):
                x, y = next(stream)
                loss = nn.functional.mse_loss(model(x), y)
                (loss / (case.gas * dp)).backward()
                total += loss.item() / (case.gas * dp)
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
        opt.step()
        losses.append(total)
    return {"losses": losses, "norms": norms}


class Sleep(nn.Module):
    """A layer of ``seconds`` forward and ``seconds`` backward (a stand-in for compute that is
    immune to CPU contention: sleeping needs no core), with one parameter so the stage has
    something to train."""

    def __init__(self, seconds: float, width: int = WIDTH) -> None:
        super().__init__()
        self.seconds = seconds
        self.scale = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from bench.pipeline_balance import Wait

        return Wait.apply(x * self.scale, self.seconds)


# -- a model nobody here wrote: a tiny Hugging Face Llama, tensor-parallel by its own plan -----


def _llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    return LlamaForCausalLM(config)


def _tokens(n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, 64, (2, 9), generator=g) for _ in range(n)]


LLAMA_STEPS, LLAMA_GAS = 3, 2


def run_llama(world: int) -> dict[str, list[float]]:
    """dp x tp2 on the model's own ``_tp_plan`` (ZeRO-2): data-parallel mean loss per step."""
    import torch.distributed as dist

    import zeroscope.engine.api as deepspeed

    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": LLAMA_GAS,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.0}},
        "zero_optimization": {"stage": 2},
        "tensor_parallel": {"autotp_size": 2},
    }
    engine, *_ = deepspeed.initialize(model=_llama(), config=config)
    dp = world // 2
    stream = iter(_tokens(LLAMA_STEPS * LLAMA_GAS * dp)[engine.parallel.coords.dp :: dp])
    losses = []
    for _ in range(LLAMA_STEPS):
        total = torch.zeros(1)
        for _ in range(LLAMA_GAS):
            ids = next(stream)
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
            total += loss.detach() / LLAMA_GAS
        dist.all_reduce(total, group=engine.comm.group)
        losses.append(float(total) / dp)
    return {"losses": losses}


def reference_llama(world: int) -> list[float]:
    dp = world // 2
    model = _llama()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    data = _tokens(LLAMA_STEPS * LLAMA_GAS * dp)
    streams = [iter(data[d::dp]) for d in range(dp)]
    losses = []
    for _ in range(LLAMA_STEPS):
        opt.zero_grad()
        total = 0.0
        for stream in streams:
            for _ in range(LLAMA_GAS):
                ids = next(stream)
                loss = model(input_ids=ids, labels=ids).loss
                (loss / (LLAMA_GAS * dp)).backward()
                total += loss.item() / (LLAMA_GAS * dp)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(total)
    return losses


# -- DeepSpeed's mpu: the user parallelizes the model and hands the engine its groups ---------


class MeshMpu:
    """A Megatron-style ``mpu`` over a user's (dp, tp) DeviceMesh."""

    def __init__(self, mesh: Any) -> None:
        self.mesh = mesh

    def get_data_parallel_group(self) -> Any:
        return self.mesh.get_group("dp")

    def get_data_parallel_rank(self) -> int:
        return int(self.mesh.get_local_rank("dp"))

    def get_data_parallel_world_size(self) -> int:
        return int(self.mesh.size(0))

    def get_model_parallel_group(self) -> Any:
        return self.mesh.get_group("tp")

    def get_model_parallel_rank(self) -> int:
        return int(self.mesh.get_local_rank("tp"))

    def get_model_parallel_world_size(self) -> int:
        return int(self.mesh.size(1))


def run_mpu(world: int, steps: int = 3, gas: int = 4) -> dict[str, list[float]]:
    """The user's own tensor parallelism (parallelize_module on their mesh) with ``mpu=``:
    ZeRO-2 over mpu's data-parallel group, the norm over its model-parallel group."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    import zeroscope.engine.api as deepspeed

    dp = world // 2
    mesh = init_device_mesh("cpu", (dp, 2), mesh_dim_names=("dp", "tp"))
    model = reference_model(layer_specs())
    plan: dict[str, Any] = {}
    for name, module in model.named_modules():
        if isinstance(module, Block):
            plan[f"{name}.fc1"], plan[f"{name}.fc2"] = ColwiseParallel(), RowwiseParallel()
    parallelize_module(model, mesh["tp"], plan)
    case = Case("mpu", pp=1, tp=2, stage=2, steps=steps, gas=gas)
    config = {k: v for k, v in case.ds_config().items() if k != "tensor_parallel"}
    mpu = MeshMpu(mesh)
    engine, *_ = deepspeed.initialize(model=model, config=config, mpu=mpu)
    stream = iter(microbatches(gas * steps * dp)[mpu.get_data_parallel_rank() :: dp])
    losses, norms = [], []
    for _ in range(steps):
        total = torch.zeros(1)
        for _ in range(gas):
            x, y = next(stream)
            loss = nn.functional.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()
            total += loss.detach() / gas
        dist.all_reduce(total, group=mpu.get_data_parallel_group())
        losses.append(float(total) / dp)
        norms.append(float(engine.get_global_grad_norm()))
    return {"losses": losses, "norms": norms}
