"""What a rank that runs real DeepSpeed imports and probes before its first step, done once by
the forkserver that starts such ranks (tests/distributed.py, ``preload=DEEPSPEED``) instead of
once per rank: ``deepspeed`` itself, inductor's compile_fx (DeepSpeed's ``initialize`` imports
its Muon optimizer, whose module-level ``torch.compile`` loads it), transformers' models the
jobs build, and DeepSpeed's probe of which ops this machine can build (it compiles and links a C
program for libaio), whose answer is the same in every rank of one machine.

Imported only in that server; a rank forked from it inherits the modules. The server runs with
``DS_ACCELERATOR=cpu``, as every such rank does before DeepSpeed looks."""

from __future__ import annotations

import deepspeed
import deepspeed.ops
import torch._inductor.compile_fx  # noqa: F401
import transformers  # noqa: F401

COMPATIBLE_OPS = deepspeed.ops.__compatible_ops__
