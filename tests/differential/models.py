"""The models of the differential suite: two that nobody here wrote (Hugging Face ``transformers``
Llama and GPT-2 from tiny configs, no downloads) and one hand-made model with every shape that
has broken ZeRO code before.

Every builder is deterministic for a seed and returns a fresh model; ``loss_of(model, batch)``
is the one training-step call both engines see (the same script on both sides).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, SEQ = 48, 8

Register = Callable[[nn.Module, nn.Parameter], None]
"""``register_external_parameter(module, param)``: DeepSpeed's ``deepspeed.zero`` function on
the DeepSpeed side, the engine's on ours."""


class _Adapter(nn.Module):
    """Uses a parameter that another module owns (``source.weight``) inside its own forward:
    the case ``register_external_parameter`` exists for."""

    def __init__(self, source: nn.Linear, register: Register) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.full((source.out_features,), 0.5))
        self._source = [source]  # a list: not a submodule, so not its parameters' owner
        register(self, source.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.gain * F.linear(x, self._source[0].weight)


class OddModel(nn.Module):
    """A tied embedding/head, a frozen layer, a 1-element parameter used by the root module, a
    module called twice per forward, a parameter used outside its module, and parameter sizes on
    both sides of a persistence threshold of 50 (1, 10, 12, 100, 130, 480 elements...)."""

    def __init__(self, register: Register, dim: int = 12) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, dim)
        self.frozen = nn.Linear(dim, dim)
        self.frozen.requires_grad_(False)
        self.scale = nn.Parameter(torch.tensor([1.25]))
        self.shared = nn.Linear(dim, dim)  # applied twice
        self.up = nn.Linear(dim, 3 * dim + 1)  # odd width: padding to a multiple of the ranks
        self.down = nn.Linear(3 * dim + 1, dim)
        self.adapter = _Adapter(self.shared, register)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB, bias=False)
        self.head.weight = self.tok.weight  # tied

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx)
        x = x + torch.tanh(self.frozen(x))
        x = self.shared(x) * self.scale
        x = x + self.down(F.gelu(self.up(x)))
        x = self.shared(self.adapter(x))
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def odd(register: Register) -> nn.Module:
    return OddModel(register)


class TiedHeadScript(nn.Module):
    """A hand-written tied head, as scripts write it: the embedding's weight multiplied in the
    root's own forward, nothing registered. At stage 3 with persistence 0 the weight is
    partitioned when the root reads it; DeepSpeed finds and gathers it (its parameter dict's
    getter), and so must the engine."""

    def __init__(self, dim: int = 12) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, dim)
        self.mix = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx)
        x = x + F.gelu(self.mix(x))
        logits = self.norm(x) @ self.tok.weight.t()
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def tiedhead(register: Register) -> nn.Module:
    return TiedHeadScript()


def llama(register: Register) -> nn.Module:
    """LlamaForCausalLM: tied embeddings, grouped-query attention (4 heads, 2 KV heads)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2 * SEQ,
        tie_word_embeddings=True,
        attn_implementation="eager",
    )
    return LlamaForCausalLM(cfg)


def gpt2(register: Register) -> nn.Module:
    """GPT2LMHeadModel (tied lm_head), dropout off so both engines see the same function."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        vocab_size=VOCAB,
        n_positions=2 * SEQ,
        n_embd=16,
        n_layer=2,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        attn_implementation="eager",
    )
    return GPT2LMHeadModel(cfg)


MODELS: dict[str, Callable[[Register], nn.Module]] = {
    "odd": odd,
    "llama": llama,
    "gpt2": gpt2,
    "tiedhead": tiedhead,
}

SCRIPT_MODELS = (OddModel, TiedHeadScript)
"""Models called as ``model(idx, targets)`` and returning the loss (the rest are transformers
models, called with ``input_ids`` and ``labels``)."""


def build_model(name: str, register: Register, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    if name.startswith("gen"):  # a generated model: "gen<seed>" (tests/differential/generated.py)
        from .generated import build_generated

        return build_generated(int(name[3:]))
    return MODELS[name](register)


def loss_of(model: Any, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """One micro-batch's loss through ``model`` (an engine or a plain module)."""
    x, y = batch
    out = model(x, y) if _is_odd(model) else model(input_ids=x, labels=x)
    return out if isinstance(out, torch.Tensor) else out.loss


def _is_odd(model: Any) -> bool:
    from .generated import GeneratedModel

    return isinstance(getattr(model, "module", model), (*SCRIPT_MODELS, GeneratedModel))


def micro_batches(count: int, rank: int, world: int, *, batch: int = 2, seed: int = 0) -> list:
    """The micro-batches rank ``rank`` trains on, in order; the data of micro-step k is the same
    whichever run (or resumed run) trains it."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        data = torch.randint(0, VOCAB, (world * batch, SEQ + 1), generator=g)
        mine = data[rank * batch : (rank + 1) * batch]
        out.append((mine[:, :-1].contiguous(), mine[:, 1:].contiguous()))
    return out
