"""The attach undone and installed again holds what one install holds.

The compiled-model wrapper (agent/attach/compiled.py) runs every entry of its registries at
every compiled forward: which module's forward is the step's (DDP's and FSDP2's predicates),
the FSDP2 root finder, the unwrapped forwards. Those entries were appended by each install and
never removed, so a part installed again after ``patches.restore_all()`` or rolled back after a
failure left one more each time: the overhead bench switches the attach on and off hundreds of
times, and by its end a compiled DDP step ran ~150 FSDP2 root checks (each a caught
AttributeError), ~2% of the step that the bench charged to the attach. Oracle: the registries'
sizes after the first install, and empty ones after everything is undone. Runs in a child
process: the attach patches torch's classes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.distributed import free_port

ROOT = Path(__file__).resolve().parent.parent

PROBE = textwrap.dedent(
    """
    import json
    from zeroscope.agent.attach import install, patches
    install.install()  # as the bootstrap does, before torch is imported
    import torch.distributed
    import torch.distributed.fsdp  # FSDP1's part installs once its module is imported
    import torch._dynamo  # the compiled part's import hook fires now
    from zeroscope.agent.attach import compiled, ddp

    def sizes():
        return [len(compiled.OWNERS), len(compiled.BEFORE_FORWARD), len(compiled.ORIGINAL_FORWARD)]

    out = {"first": sizes()}
    for _ in range(5):  # the overhead bench's switch
        patches.restore_all()
        install._torch_ready(None)
    out["again"] = sizes()
    patches.restore_all()
    out["undone"] = sizes()
    mark = patches.checkpoint()
    ddp.install()
    out["ddp"] = sizes()
    patches.rollback(mark)  # what install.guarded does when a part fails half-way
    out["rolled_back"] = sizes()
    print(json.dumps(out))
    """
)


def test_installing_the_attach_again_adds_no_second_entry_to_the_compiled_registries() -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    # Nothing is sent until an engine is found: no collector needs to listen.
    env["ZEROSCOPE_COLLECTOR"] = f"tcp://127.0.0.1:{free_port()}"
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    sizes = json.loads(done.stdout.splitlines()[-1])
    # DDP, FSDP2 and FSDP1 each say which compiled modules are theirs; FSDP2 finds its root;
    # DDP and FSDP1 give their unwrapped forward.
    assert sizes["first"] == [3, 1, 2], sizes
    assert sizes["again"] == sizes["first"], sizes
    assert sizes["undone"] == [0, 0, 0], sizes
    assert sizes["ddp"] == [1, 0, 1], sizes
    assert sizes["rolled_back"] == [0, 0, 0], sizes
