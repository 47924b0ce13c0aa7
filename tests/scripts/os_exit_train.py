"""A plain loop that trains a few quick steps, prints each loss and ends by ``os._exit(N)`` (as
jobs do to dodge a hang in a process group's teardown): no exit hook of Python's runs."""

from __future__ import annotations

import os
import sys

import torch


def main() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(6):
        loss = model(torch.randn(4, 16)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(f"step {step} loss {loss.item():.6f}", flush=True)
    os._exit(int(sys.argv[1]))


if __name__ == "__main__":
    main()
