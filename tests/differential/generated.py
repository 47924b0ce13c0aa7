"""Models built by a generator (hypothesis strategies) rather than by hand, for the
differential suite: small module trees with the shapes that break ZeRO code.

A :class:`ModelSpec` is drawn from :func:`specs` deterministically for a seed
(:func:`spec_for`), so both engines' rank processes rebuild the same model from ``"gen<seed>"``
alone. What a spec can hold:

- ``linear``: a residual ``tanh(Linear)``; ``twice``: one Linear called twice per forward;
- ``scale``: a 1-element parameter; ``frozen``: a Linear with ``requires_grad=False``;
- ``shared``: a previous block's module placed again in the tree (shared parameters);
- ``parent``: the root's forward reads a block's weight itself (used outside its module:
  at stage 3 with persistence 0 both engines must find and gather it unregistered);
- ``buffer``: a float buffer and an integer buffer used in forward;
- widths around the stage-3 persistence threshold (small and large Linears), and the head
  either separate or tied to the embedding, written both ways (``head.weight = tok.weight``
  or ``tok.weight = head.weight``).

:func:`fixed_budget` is the few cells ``make test`` runs; ``make test-soak`` runs many seeds
(tests/differential/soak.py) and prints each failing seed's spec.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from torch import nn

from .cells import Cell

VOCAB = 48
KINDS = ("linear", "twice", "scale", "frozen", "shared", "parent", "buffer")


@dataclass(frozen=True)
class BlockSpec:
    kind: str
    width: int
    """Hidden width of a Linear block's inner layer (its weight is dim x width)."""
    bias: bool


@dataclass(frozen=True)
class ModelSpec:
    dim: int
    blocks: tuple[BlockSpec, ...]
    tie: str
    """none | head (head.weight = tok.weight) | tok (tok.weight = head.weight) | parent (the
    root multiplies by tok.weight itself)."""

    def describe(self) -> str:
        inner = ", ".join(f"{b.kind}(w={b.width}{', bias' if b.bias else ''})" for b in self.blocks)
        return f"dim={self.dim} tie={self.tie} blocks=[{inner}]"


def specs() -> st.SearchStrategy[ModelSpec]:
    block = st.builds(
        BlockSpec,
        kind=st.sampled_from(KINDS),
        width=st.sampled_from([1, 3, 8, 40]),
        bias=st.booleans(),
    )
    return st.builds(
        ModelSpec,
        dim=st.sampled_from([2, 4, 6]),
        blocks=st.lists(block, min_size=1, max_size=4).map(tuple),
        tie=st.sampled_from(["none", "head", "tok", "parent"]),
    )


def spec_for(n: int) -> ModelSpec:
    """The spec hypothesis draws for seed ``n`` (deterministic, no example database). Its first
    draw is always the simplest spec, so the fourth is taken."""
    found: list[ModelSpec] = []

    @seed(n)
    @settings(
        max_examples=4,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        deadline=None,
    )
    @given(specs())
    def draw(spec: ModelSpec) -> None:
        found.append(spec)

    draw()
    return found[-1]


class _Residual(nn.Module):
    def __init__(self, dim: int, width: int, bias: bool) -> None:
        super().__init__()
        self.up = nn.Linear(dim, width, bias=bias)
        self.down = nn.Linear(width, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(x)))


class _Twice(nn.Module):
    def __init__(self, dim: int, bias: bool) -> None:
        super().__init__()
        self.lin = nn.Linear(dim, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 0.5 * self.lin(torch.tanh(self.lin(x)))


class _Scale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.s = nn.Parameter(torch.tensor([1.1]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.s


class _Buffers(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.register_buffer("shift", torch.randn(dim) * 0.1)
        self.register_buffer("times", torch.tensor(2, dtype=torch.int64))
        self.gain = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + self.shift) * self.gain / self.times


class GeneratedModel(nn.Module):
    """The module tree a :class:`ModelSpec` describes; ``forward(idx, targets)`` -> loss."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        dim = spec.dim
        self.tok = nn.Embedding(VOCAB, dim)
        self.blocks = nn.ModuleList()
        self.parent_reads: list[int] = []
        for b in spec.blocks:
            if b.kind == "linear":
                self.blocks.append(_Residual(dim, b.width, b.bias))
            elif b.kind == "twice":
                self.blocks.append(_Twice(dim, b.bias))
            elif b.kind == "scale":
                self.blocks.append(_Scale())
            elif b.kind == "frozen":
                block = _Residual(dim, b.width, b.bias)
                block.requires_grad_(False)
                self.blocks.append(block)
            elif b.kind == "shared":
                earlier = [m for m in self.blocks if isinstance(m, _Residual | _Twice)]
                self.blocks.append(earlier[-1] if earlier else _Twice(dim, b.bias))
            elif b.kind == "parent":
                self.blocks.append(_Residual(dim, b.width, b.bias))
                self.parent_reads.append(len(self.blocks) - 1)
            else:
                self.blocks.append(_Buffers(dim))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB, bias=False)
        if spec.tie == "head":
            self.head.weight = self.tok.weight
        elif spec.tie == "tok":
            self.tok.weight = self.head.weight

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx)
        for i, block in enumerate(self.blocks):
            x = block(x)
            if i in self.parent_reads:  # a weight read outside its module
                down = self.blocks[i].down.weight  # dim x width
                x = x + 0.1 * torch.tanh(x @ down @ down.t())
        h = self.norm(x)
        logits = h @ self.tok.weight.t() if self.spec.tie == "parent" else self.head(h)
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def build_generated(n: int) -> nn.Module:
    return GeneratedModel(spec_for(n))


def cell_for(n: int) -> Cell:
    """The training cell of seed ``n``: its stage, persistence and optimizer vary with it."""
    stage = n % 4
    persistence = (0, None)[(n // 4) % 2] if stage == 3 else None
    optimizer = ("AdamW", "client-SGD", "Adagrad")[(n // 8) % 3]
    return Cell(
        model=f"gen{n}",
        stage=stage,
        persistence=persistence,
        optimizer=optimizer,
        accumulation=2,
        steps=3,
        scheduler=None,
    )


def fixed_budget() -> list[Cell]:
    """The seeds ``make test`` runs: every stage, both persistence settings at stage 3, each
    optimizer kind."""
    return [cell_for(n) for n in (0, 3, 7, 9, 14, 19)]
