"""Stage 3's memory-efficient Linear under autocast, with a bias, against ``F.linear`` (what
stages 0-2 run) under the same autocast: the same output dtype, values within bf16 rounding,
and gradients of the parameters' own dtype.

Before, its forward returned ``x @ w.T + bias``: a bf16 product plus an fp32 bias promoted to
fp32, so every biased Linear of a stage-3 model under ``torch.autocast`` returned fp32 where
stage 0 (and DeepSpeed's LinearFunctionForZeroStage3, whose ``output += bias`` and ``addmm``
keep the autocast dtype) return bf16: the next layer ran at twice the activation memory.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from zeroscope.engine.zero.stage3.linear import patch_linears, unpatch_linears


def _run(model: nn.Module, x: torch.Tensor, device: str) -> tuple[torch.Tensor, list]:
    with torch.autocast(device, dtype=torch.bfloat16):
        out = model(x)
    out.float().square().mean().backward()
    return out, [p.grad for p in model.parameters()]


@pytest.mark.parametrize("shape", [(6, 16), (2, 3, 16)], ids=["2-d input", "3-d input"])
def test_a_biased_linear_keeps_the_autocast_dtype_like_stage_0(shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))
    zero3 = copy.deepcopy(reference)
    patched = patch_linears(zero3)
    assert len(patched) == 2
    x = torch.randn(*shape)
    want, want_grads = _run(reference, x, "cpu")
    got, got_grads = _run(zero3, x, "cpu")
    assert want.dtype == torch.bfloat16
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    for p, g, w in zip(zero3.parameters(), got_grads, want_grads, strict=True):
        assert g.dtype == p.dtype == torch.float32
        torch.testing.assert_close(g, w, rtol=5e-2, atol=5e-3)
    unpatch_linears(patched)


@pytest.mark.gpu
def test_gpu_a_biased_linear_keeps_the_autocast_dtype_like_stage_0() -> None:
    """The same on CUDA (fp16 and bf16): before, ``out + bias`` returned fp32."""
    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        reference = nn.Linear(64, 64).cuda()
        zero3 = copy.deepcopy(reference)
        patched = patch_linears(zero3)
        x = torch.randn(4, 5, 64, device="cuda")
        with torch.autocast("cuda", dtype=dtype):
            want, got = reference(x), zero3(x)
        assert got.dtype == want.dtype == dtype
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
        unpatch_linears(patched)
