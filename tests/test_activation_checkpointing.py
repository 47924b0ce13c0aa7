"""Activation checkpointing: the bytes saved for backward fall (measured with saved-tensor
hooks), losses and gradients stay identical, also through the engine at stages 2 and 3 on 2
gloo ranks, where the stage-3 recompute gathers the parameters again."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tests.distributed import run_ranks
from tests.models import TinyGPT, batches
from tests.offload_support import build, ds_config, train


class CheckpointedGPT(TinyGPT):
    """TinyGPT whose blocks run under ``zeroscope.engine.checkpointing.checkpoint``."""

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        from zeroscope.engine.checkpointing import checkpoint

        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = checkpoint(lambda h, b=block: self.shared(b(self.shared(h))), x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


class SavedBytes:
    """Bytes of the tensors autograd saves for backward (parameters excluded: not activations)."""

    def __init__(self) -> None:
        self.total = 0

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        if not isinstance(t, torch.nn.Parameter):
            self.total += t.numel() * t.element_size()
        return t

    def hooks(self) -> Any:
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)


def _loss_grads_bytes(cls: type[TinyGPT]) -> tuple[float, list[torch.Tensor], int]:
    torch.manual_seed(0)
    model = cls(dim=24, seq=16)
    x, y = batches(1, 4, seq=16)[0]
    saved = SavedBytes()
    with saved.hooks():
        loss = model(x, y)
    loss.backward()
    return float(loss.detach()), [p.grad.clone() for p in model.parameters()], saved.total


def test_checkpointing_saves_less_and_changes_nothing() -> None:
    loss, grads, full = _loss_grads_bytes(TinyGPT)
    loss_ck, grads_ck, kept = _loss_grads_bytes(CheckpointedGPT)
    assert loss_ck == loss
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_ck))
    assert kept < full / 3, (kept, full)


def test_configure_reads_the_ds_config_block() -> None:
    from zeroscope.engine import checkpointing

    cfg = checkpointing.configure(
        None, deepspeed_config={"activation_checkpointing": {"number_checkpoints": 4}}
    )
    assert checkpointing.is_configured() and cfg.number_checkpoints == 4
    with pytest.raises(
        ValueError,
        match="cpu_checkpointing=True: moving checkpointed activations to the CPU is not built",
    ):
        checkpointing.configure(None, checkpoint_in_cpu=True)


def _engine_ranks(rank: int, world: int) -> dict[str, Any]:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    out = {}
    for stage in (2, 3):
        # Stage 3 without prefetch or reuse: every use of a module is one all-gather.
        zero = (
            {
                "stage3_param_persistence_threshold": 0,
                "stage3_prefetch_bucket_size": 0,
                "stage3_max_reuse_distance": 0,
            }
            if stage == 3
            else {}
        )
        result = {}
        for name, cls in (("plain", TinyGPT), ("checkpointed", CheckpointedGPT)):
            run = build(ds_config(stage, **zero))
            if cls is CheckpointedGPT:
                run.engine.module.__class__ = CheckpointedGPT  # same weights, checkpointed forward
            saved = SavedBytes()
            with saved.hooks():
                losses = train(run, rank, world, range(3))
            gathers = sum(c.op == "all_gather" for c in run.recorder.steps[-1].collectives)
            result[name] = (losses, saved.total, gathers)
        out[f"s{stage}"] = result
    return out


@pytest.fixture(scope="module")
def engine_runs() -> dict[str, Any]:
    return run_ranks(_engine_ranks, 2, timeout=180)[0]


@pytest.mark.parametrize("stage", ["s2", "s3"])
def test_engine_losses_identical_and_activations_fall(engine_runs: dict, stage: str) -> None:
    plain, ck = engine_runs[stage]["plain"], engine_runs[stage]["checkpointed"]
    assert ck[0] == plain[0]
    assert ck[1] < plain[1] / 2


def test_stage3_recompute_gathers_again(engine_runs: dict) -> None:
    plain, ck = engine_runs["s3"]["plain"], engine_runs["s3"]["checkpointed"]
    assert ck[2] > plain[2]
