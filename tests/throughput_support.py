"""A GPT of known shape for the throughput tests: every matmul weight is a plain ``nn.Linear``
used once per forward, so the closed form 6·N·T + 12·layers·hidden·seq·T is exact for it and N
is a formula of its dimensions (``dense_params``), independent of the agent's own count."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class KnownBlock(nn.Module):
    """Pre-norm block: causal attention through explicit matmuls, a 4x MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class KnownGPT(nn.Module):
    """``forward(idx, targets)`` returns the mean cross-entropy; untied output layer."""

    def __init__(
        self, vocab: int = 64, dim: int = 32, heads: int = 4, layers: int = 2, seq: int = 16
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(KnownBlock(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return F.cross_entropy(self.head(self.ln_f(x)).flatten(0, 1), targets.flatten())


def dense_params(vocab: int = 64, dim: int = 32, layers: int = 2) -> int:
    """N of KnownGPT by hand: per block qkv 3d², proj d², MLP 2·4d²; the output layer V·d."""
    return layers * (3 * dim * dim + dim * dim + 8 * dim * dim) + vocab * dim


def closed_form(
    tokens: int, *, vocab: int = 64, dim: int = 32, layers: int = 2, seq: int = 16
) -> tuple[float, float]:
    """(6·N·T, 12·layers·dim·seq·T): the dense term and the attention term of a step's FLOPs."""
    return 6.0 * dense_params(vocab, dim, layers) * tokens, 12.0 * layers * dim * seq * tokens
