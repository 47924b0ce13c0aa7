"""Tier 4 (CUDA only): the work meter's device paths, never run yet (no GPU in the session
that wrote them): an attention mask's sum read on the sender side through a CUDA event, the
datasheet peak chosen for a GPU the table knows (bf16 here), the FLOP count on CUDA kernels
(torch's own attention formulas), and the losses unchanged by the count.

Why today's code could fail them: the mask's DeferredScalar is read with ``ready(block=True)``
on the sender thread, whose CUDA stream handling is untested here; an H200 reports its name as
torch prints it, which the table's matching (``"H200"``) is assumed, not seen, to match."""

from __future__ import annotations

import pytest
import torch

from tests.throughput_support import KnownGPT, closed_form
from zeroscope.agent.peak import datasheet_peak
from zeroscope.agent.work import WorkMeter, work_report

pytestmark = pytest.mark.gpu


def test_meter_on_cuda_counts_reads_the_mask_and_leaves_losses_alone() -> None:
    device = torch.device("cuda")

    def losses(meter: WorkMeter | None) -> tuple[list[float], list]:
        torch.manual_seed(0)
        model = KnownGPT(seq=16).to(device)
        idx = torch.randint(0, 64, (2, 16), device=device, generator=None)
        out, works = [], []
        for step in (1, 2):
            if meter is not None:
                meter.inputs(model, (idx, idx), {}, step)
            loss = model(idx, idx)
            loss.backward()
            out.append(loss.item())
            if meter is not None:
                facts = meter.take(step)
                assert facts is not None
                works.append(work_report(facts))
        return out, works

    watched, works = losses(WorkMeter())
    plain, _ = losses(None)
    assert watched == plain
    assert works[0].flops == sum(closed_form(32, seq=16)) == works[1].flops
    name = torch.cuda.get_device_name(device)
    known = datasheet_peak(name, "fp32" if not torch.backends.cuda.matmul.allow_tf32 else "tf32")
    if known is not None:
        assert (works[1].peak_flops, works[1].peak_source) == known
    mask = torch.ones(2, 16, dtype=torch.long, device=device)
    mask[0, 12:] = 0
    meter = WorkMeter()
    model = KnownGPT(seq=16).to(device)
    ids = torch.zeros(2, 16, dtype=torch.long, device=device)
    meter.inputs(model, (), {"input_ids": ids, "attention_mask": mask}, 1)
    facts = meter.take(1)
    assert facts is not None and work_report(facts).tokens == 28
