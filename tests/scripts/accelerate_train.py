"""A script written for ``accelerate launch`` (the shape of accelerate's own examples:
``Accelerator()``, ``prepare``, ``accelerator.backward``); with a DeepSpeed or an FSDP plugin
chosen by the launch flags, not by the script. Each rank prints one ``LOSS`` line per step."""

import argparse
import sys

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=4)
args = parser.parse_args()
accelerator = Accelerator()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 2))
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
g = torch.Generator().manual_seed(1)
data = TensorDataset(torch.randn(16 * args.steps, 8, generator=g))
loader = DataLoader(data, batch_size=4)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
model.train()
if accelerator.process_index == 0:
    # what accelerate built around the model, for the test to compare with the header's engine
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    wrapped = "fsdp2" if isinstance(model, FSDPModule) else "none"
    wrapped = "ddp" if isinstance(model, DistributedDataParallel) else wrapped
    sys.stdout.write(f"WRAPPED {wrapped}\n")  # one write per line (see LOSS below)
    sys.stdout.flush()
for step, (x,) in enumerate(loader, start=1):
    if step > args.steps:
        break
    loss = model(x).pow(2).mean()
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    # one write per line: print() on the ranks' shared unbuffered stdout writes the text and its
    # newline apart, and two ranks' lines glued together
    sys.stdout.write(f"LOSS rank {accelerator.process_index} step {step} {loss.item():.8f}\n")
    sys.stdout.flush()
