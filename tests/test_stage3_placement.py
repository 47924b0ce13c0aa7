"""Stage 3 without ``zero.Init`` moves the parameters to the device one at a time as it
partitions them, instead of the whole model first: the device never holds more than one full
parameter beyond the shards (and the persistent ones, whole by design). Checked by a dispatch
canary that watches every storage torch allocates during ``initialize()``, on two ranks, beside
the old move-then-partition path (the whole model moved first, which the canary must catch) and
``zero.Init``'s path: shards, losses, optimizer state and the consolidated weights bit-identical.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from tests.distributed import run_ranks

VOCAB, DIM, SEQ, MICRO, STEPS = 50, 64, 6, 2, 4
PERSISTENT = 100  # the LayerNorm's weight and bias stay whole; every other parameter is cut


def _config(precision: str = "bf16") -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": MICRO,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": PERSISTENT},
    }
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


class Placed(nn.Module):
    """An embedding tied to the head, a Linear applied twice per layer (shared), a weight read
    in the root's own forward (external to its module), a float buffer (cast like the
    parameters) and an integer one (not cast), a persistent LayerNorm. The cut parameters have
    3200 and 4096 elements, no shard or flat shard buffer of two ranks has either size."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(nn.Linear(DIM, DIM, bias=False) for _ in range(2))
        self.shared = nn.Linear(DIM, DIM, bias=False)
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.tok.weight
        self.register_buffer("scale", torch.linspace(0.5, 1.5, DIM))
        self.register_buffer("seen", torch.zeros((), dtype=torch.long))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) * self.scale
        for layer in self.layers:
            x = self.shared(torch.tanh(layer(self.shared(x))))
        x = x @ self.layers[0].weight.t()
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


class FullCopies(TorchDispatchMode):
    """Counts, after every aten op, the live storages that hold one whole parameter in the
    training dtype: ``sizes`` are the byte sizes of the parameters that should be cut. Liveness
    is the storage's own (a weak reference to it), so a copy kept alive through a view, a
    ``param.data`` or a local variable is counted until torch frees it."""

    def __init__(self, dtype: torch.dtype, sizes: set[int]) -> None:
        super().__init__()
        self.dtype, self.sizes = dtype, sizes
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.peak_count = self.peak_bytes = 0

    def _settle(self, limit_s: float = 1.0) -> None:
        """Before a new full copy is counted, give the copies already seen up to ``limit_s``
        to be freed: gloo's worker thread drops its reference to a broadcast's tensor just
        after ``wait()`` returns, so on a busy machine the last parameter's copy could still
        be alive, held by torch and not by the engine, when the next is made (the clean-clone
        run counted 2). A copy the engine still holds stays alive past the limit and counts
        (the whole model moved first: 4)."""
        deadline = time.monotonic() + limit_s
        while any(not ref.expired() for ref, _ in self.live.values()):
            if time.monotonic() > deadline:
                return
            time.sleep(0.001)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.dtype != self.dtype:
                continue
            storage = t.untyped_storage()
            if storage.nbytes() in self.sizes:
                ref = StorageWeakRef(storage)
                if ref.cdata not in self.live:
                    self._settle()
                self.live.setdefault(ref.cdata, (ref, storage.nbytes()))
        self.live = {k: v for k, v in self.live.items() if not v[0].expired()}
        self.peak_count = max(self.peak_count, len(self.live))
        self.peak_bytes = max(self.peak_bytes, sum(n for _, n in self.live.values()))
        return out


def _build(mode: str) -> nn.Module:
    torch.manual_seed(0)
    if mode == "zero.Init":
        from zeroscope.engine.zero.stage3.zero_init import ZeroInit

        with ZeroInit(config=_config()):
            return Placed()
    return Placed()


def _place_and_train(rank: int, world: int) -> dict[str, Any]:
    from zeroscope.engine.api import initialize

    cut = {
        2 * p.numel() for p in Placed().parameters() if p.numel() > PERSISTENT
    }  # bf16 bytes of each parameter that is partitioned
    largest = max(cut)
    out: dict[str, Any] = {}
    for mode in ("one at a time", "moved first", "zero.Init"):
        model = _build(mode)
        canary = FullCopies(torch.bfloat16, cut)
        with canary:
            if mode == "moved first":  # what initialize() did before: the whole model first
                model.to(device=torch.device("cpu"), dtype=torch.bfloat16)
            engine, *_ = initialize(model=model, config=_config())
        part = engine.strategy.partition
        row: dict[str, Any] = {
            "peak_count": canary.peak_count,
            "peak_bytes": canary.peak_bytes,
            "largest": largest,
            "shards": part.shards.clone(),
            "buffers": {k: v.clone() for k, v in model.named_buffers()},
            "persistent": {
                sp.name: sp.param.detach().clone() for sp in part.params if sp.persistent
            },
        }
        data = torch.Generator().manual_seed(5)
        losses = []
        for _ in range(STEPS):
            idx = torch.randint(0, VOCAB, (MICRO * world, SEQ), generator=data)
            tgt = torch.randint(0, VOCAB, (MICRO * world, SEQ), generator=data)
            rows = slice(rank * MICRO, (rank + 1) * MICRO)
            loss = engine(idx[rows], tgt[rows])
            engine.backward(loss)
            engine.step()
            losses.append(loss.detach().float().item())
        row["losses"] = losses
        row["optimizer"] = engine.strategy.state_dict()
        row["consolidated"] = engine.strategy.consolidated_16bit_state_dict()
        out[mode] = row
    # Compared here: tensors do not travel back through the result queue.
    new = out["one at a time"]
    weights = new["consolidated"]
    return {
        "peaks": {mode: (row["peak_count"], row["peak_bytes"]) for mode, row in out.items()},
        "largest": largest,
        "same": {
            other: {key: _same(new[key], out[other][key]) for key in COMPARED}
            for other in ("moved first", "zero.Init")
        },
        "dtypes": {k: str(v.dtype) for k, v in new["buffers"].items()},
        "tied": None
        if weights is None
        else torch.equal(weights["tok.weight"], weights["head.weight"]),
        "losses": new["losses"],
    }


COMPARED = ("shards", "buffers", "persistent", "losses", "optimizer", "consolidated")


def _same(a: Any, b: Any) -> bool:
    """Bit-identical, through dicts and lists of tensors and numbers."""
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@pytest.fixture(scope="module")
def runs() -> list[dict[str, Any]]:
    return run_ranks(_place_and_train, 2, timeout=240.0)


def test_canary_sees_the_whole_model_moved_first(runs: list[dict[str, Any]]) -> None:
    """The control: with the model moved and cast before ``initialize()`` (the old path) the
    canary counts every cut parameter whole at once; it can fail."""
    for rank in runs:
        count, nbytes = rank["peaks"]["moved first"]
        assert count == 4  # tok (tied to head), two layers, shared
        assert nbytes == 2 * (VOCAB * DIM + 3 * DIM * DIM)


def test_at_most_one_full_parameter_at_a_time(runs: list[dict[str, Any]]) -> None:
    for rank in runs:
        count, nbytes = rank["peaks"]["one at a time"]
        assert count == 1
        assert nbytes == rank["largest"]


@pytest.mark.parametrize("other", ["moved first", "zero.Init"])
def test_bit_identical_to_the_old_path_and_zero_init(
    runs: list[dict[str, Any]], other: str
) -> None:
    """Shards after start-up, buffers, the persistent full tensors, four steps' losses, the
    optimizer's shards and moments, and the consolidated 16-bit weights, on both ranks."""
    for rank in runs:
        assert rank["same"][other] == dict.fromkeys(COMPARED, True)
        # the float buffer cast like the parameters, the integer one left alone (Module.to's)
        assert rank["dtypes"] == {"scale": "torch.bfloat16", "seen": "torch.int64"}
    assert runs[0]["tied"] is True  # the tied weight consolidated under both its names
    assert runs[1]["tied"] is None  # rank 0 alone holds the consolidated weights
    assert runs[0]["losses"] != runs[1]["losses"]  # each rank's own micro-batches


# -- on the GPU ----------------------------------------------------------------------------------

MiB = 2**20


class FrozenStack(nn.Module):
    """``layers`` frozen ``width x width`` Linears and a small trainable head: the optimizer's
    state is the head's alone, so the device's memory at start-up is the parameters'."""

    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width, bias=False) for _ in range(layers))
        self.layers.requires_grad_(False)
        self.head = nn.Linear(width, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.head.weight.dtype)
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x).float().square().mean()


GPU_CONFIG: dict[str, Any] = {
    "train_micro_batch_size_per_gpu": 4,
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "zero_optimization": {
        "stage": 3,
        "stage3_param_persistence_threshold": 0,
        "stage3_prefetch_bucket_size": 0,
        "stage3_max_reuse_distance": 0,
    },
}


def _start_under_cap(width: int, layers: int, cap_of_model: float) -> dict[str, Any]:
    """Cap this process's CUDA allocator at ``cap_of_model`` x the model's 16-bit size (above
    what it holds already), build the model on the host, ``initialize()`` and take one step.
    Returns the start-up peak, the shard bytes and the step's loss."""
    from zeroscope.engine.api import initialize

    device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.empty_cache()
    model16 = layers * width * width * 2
    total = torch.cuda.get_device_properties(device).total_memory
    cap = torch.cuda.memory_reserved(device) + int(cap_of_model * model16)
    torch.cuda.set_per_process_memory_fraction(cap / total, device)
    try:
        torch.manual_seed(0)
        model = FrozenStack(width, layers)  # on the host, fp32
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        engine, *_ = initialize(model=model, config=GPU_CONFIG)
        peak = torch.cuda.max_memory_allocated(device) - before
        loss = engine(torch.randn(4, width, device=device))
        engine.backward(loss)
        engine.step()
        shards = engine.strategy.partition.shard_bytes
        return {"peak": peak, "shards": shards, "loss": float(loss.detach()), "model16": model16}
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)


def _two_gpu_rank(rank: int, world: int) -> dict[str, Any]:
    torch.cuda.set_device(rank)
    return _start_under_cap(width=4096, layers=16, cap_of_model=0.8)


@pytest.mark.gpu
def test_stage3_starts_with_a_second_model_copy_beyond_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One GPU, world 1 (the shards are the whole model): the allocator is capped at 1.6x the
    model's 16-bit size. Before this change it failed with OutOfMemoryError inside
    ``initialize()``: the whole 16-bit model was moved to the GPU (1x) and the shards were made
    beside it (another 1x). Now the device holds the shards and one full parameter."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    got = _start_under_cap(width=8192, layers=8, cap_of_model=1.6)
    largest = 8192 * 8192 * 2
    assert got["shards"] >= got["model16"]
    assert got["peak"] <= got["shards"] + largest + 8 * MiB, got
    assert torch.isfinite(torch.tensor(got["loss"]))


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs"
)
def test_stage3_starts_a_model_larger_than_the_cap_on_two_gpus() -> None:
    """Two ranks, each GPU capped at 0.8x the model's 16-bit size: the model does not fit one
    GPU, its half does. Before this change every rank moved the whole model to its GPU first
    and failed with OutOfMemoryError inside ``initialize()``."""
    runs = run_ranks(_two_gpu_rank, 2, gpu=True, timeout=300.0)
    largest = 4096 * 4096 * 2
    for got in runs:
        assert got["peak"] < got["model16"]
        assert got["peak"] <= got["shards"] + largest + 8 * MiB, got
        assert torch.isfinite(torch.tensor(got["loss"]))
