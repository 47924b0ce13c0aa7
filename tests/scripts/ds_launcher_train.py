"""The shape of a script started by the ``deepspeed`` launcher: it takes ``--local_rank`` (the
launcher passes it), ``deepspeed.add_config_arguments`` and ``init_distributed``; each rank
prints one ``LOSS`` line per step (what tests compare between launchers) and the launcher's
``--local_rank`` beside ``LOCAL_RANK``. It ends its process group as the test jobs do
(tests/jobs/teardown.py): the reference run under the bare launcher aborted at exit in torch's
gloo teardown one time in three ("terminate called without an active exception")."""

import argparse
import os
import sys

import deepspeed
import torch
from torch import nn

from tests.jobs.teardown import end_process_group

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1)
parser.add_argument("--steps", type=int, default=4)
parser = deepspeed.add_config_arguments(parser)
args = parser.parse_args()
deepspeed.init_distributed()
rank = deepspeed.comm.get_rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 2))
engine, *_ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
g = torch.Generator().manual_seed(1 + rank)
for step in range(1, args.steps + 1):
    x = torch.randn(4, 8, generator=g)
    loss = engine(x).pow(2).mean()
    engine.backward(loss)
    engine.step()
    # one write per line (the launcher runs the ranks with -u: print() writes the text and its
    # newline apart on the ranks' shared stdout)
    sys.stdout.write(
        f"LOSS rank {rank} step {step} {loss.item():.8f} "
        f"local_rank_arg {args.local_rank} LOCAL_RANK {os.environ.get('LOCAL_RANK')}\n"
    )
    sys.stdout.flush()
end_process_group()
