"""A plain PyTorch script with nothing of zeroscope in it: a two-rank expert-parallel layer, as a
mixture-of-experts job routes tokens. A gate sends each token to the rank holding its expert
with ``all_to_all_single`` (uneven splits: the ranks send different amounts), the expert's
output comes back the same way (``torch.distributed.nn.functional.all_to_all_single``, whose
backward is another all-to-all), and the gradients are averaged with ``all_reduce``.

Per rank it writes to ``--out``.RANK each step's loss (the exact float, hex) and the bytes of
every all-to-all it issued, in issue order: the job's own count, which a recording must match.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn

from tests.jobs.teardown import end_process_group

WIDTH = 16


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    gate, expert = torch.nn.Linear(WIDTH, world), torch.nn.Linear(WIDTH, WIDTH)
    params = [*gate.parameters(), *expert.parameters()]
    opt = torch.optim.SGD(params, lr=0.1)
    torch.manual_seed(100 + rank)
    log = []
    for step in range(1, args.steps + 1):
        x = torch.randn(8 + 2 * rank + step, WIDTH)
        dest = gate(x).argmax(-1)
        send = torch.bincount(dest, minlength=world)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)  # how many tokens each rank gets
        tokens = x[torch.argsort(dest, stable=True)]
        routed = dist_fn.all_to_all_single(
            torch.empty(int(recv.sum()), WIDTH), tokens, recv.tolist(), send.tolist()
        )
        out = torch.tanh(expert(routed))
        back = dist_fn.all_to_all_single(
            torch.empty_like(tokens), out, send.tolist(), recv.tolist()
        )
        loss = (back**2).mean() + gate(x).logsumexp(-1).mean()
        opt.zero_grad()
        loss.backward()  # the return trip's backward: the gradient of ``back`` sent back
        for p in params:
            assert p.grad is not None
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        sent = [send.nbytes, tokens.nbytes, out.nbytes, tokens.nbytes]
        log.append({"step": step, "loss": loss.item().hex(), "all_to_all": sent})
    with open(f"{args.out}.{rank}", "w") as f:
        json.dump(log, f)
    end_process_group()


if __name__ == "__main__":
    main()
