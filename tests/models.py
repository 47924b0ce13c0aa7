"""A tiny GPT for tests across the project: small enough for seconds-long multi-rank runs, but
with the shapes that break naive ZeRO code: tied embedding / lm_head weights (one parameter,
two uses), a module called twice per forward (its gradient accumulates twice), and odd
parameter sizes (flat buffers need padding to a multiple of the rank count)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """Pre-norm transformer block with causal self-attention."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 3 * dim + 1)  # odd width
        self.out = nn.Linear(3 * dim + 1, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).float().softmax(-1).to(x.dtype)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    """``forward(idx, targets)`` returns the mean cross-entropy (computed in fp32)."""

    def __init__(
        self, vocab: int = 37, dim: int = 12, heads: int = 3, layers: int = 2, seq: int = 8
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.shared = Block(dim, heads)  # applied twice per forward
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = self.shared(block(self.shared(x)))
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


class LinearStack(nn.Module):
    """Eight bias-free ``width x width`` layers: fed one row, its gradients dwarf its
    activations (for gradient-memory tests: one layer per gradient bucket)."""

    def __init__(self, width: int, layers: int = 8) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width, bias=False) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x.square().mean()


def param_count(model: nn.Module) -> int:
    """Psi: elements of the unique parameters (a tied weight counts once)."""
    return sum(p.numel() for p in model.parameters())


def batches(
    steps: int, batch: int, *, vocab: int = 37, seq: int = 8, seed: int = 0
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Deterministic (input, target) token batches: next-token targets of random sequences."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        data = torch.randint(0, vocab, (batch, seq + 1), generator=g)
        out.append((data[:, :-1], data[:, 1:]))
    return out
