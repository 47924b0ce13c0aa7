"""A kill at a random instant of ``save_checkpoint`` leaves a loadable checkpoint: the last one
announced complete, or the one being saved if the kill came after its final rename.

tests/test_checkpoint.py kills one save at one chosen instant (midway through its files); here
a driver subprocess imports torch and the engine once, then forks a trainer that saves a new
tag after every step, SIGKILLs it at a random moment (so kills land in file writes, fsyncs,
the folder rename and the ``latest`` replacement alike), and loads what is left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

DRIVER = r"""
import json, os, random, signal, sys, time
import torch
torch.set_num_threads(1)
from tests.offload_support import build, ds_config, train

folder, kills = sys.argv[1], int(sys.argv[2])
rng = random.Random(3)
config = ds_config(2)
run = build(config)
train(run, 0, 1, range(1))
results = []
for i in range(kills):
    where = os.path.join(folder, f"ckpt-{i}")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            step = 1
            while True:
                run.engine.save_checkpoint(where, tag=f"t{step}", client_state={"step": step})
                os.write(w, step.to_bytes(4, "little"))
                step += 1
                train(run, 0, 1, range(step - 1, step))
        finally:
            os._exit(1)
    os.close(w)
    os.read(r, 4)  # one save completed: the kill clock starts
    time.sleep(rng.uniform(0.0, 0.25))
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    said = b"\0\0\0\0"
    while chunk := os.read(r, 4096):
        said += chunk
    os.close(r)
    announced = max(1, int.from_bytes(said[-4:], "little"))
    fresh = build(config, seed=9)
    path, client = fresh.engine.load_checkpoint(where)
    results.append({"announced": announced, "loaded": client["step"], "path": path,
                    "global_steps": fresh.engine.global_steps})
print(json.dumps(results))
"""


def test_random_kills_during_save_checkpoint_leave_a_loadable_checkpoint(tmp_path: Path) -> None:
    kills = 16
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, str(tmp_path), str(kills)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.splitlines()[-1])
    assert len(results) == kills
    for r in results:
        # The newest complete save, or the one in flight if it had already been renamed in.
        assert r["loaded"] in (r["announced"], r["announced"] + 1), r
        assert r["path"].endswith(f"t{r['loaded']}")
        assert r["global_steps"] == r["loaded"]  # tag k was saved after k optimizer steps
    print(f"{kills} kills during save_checkpoint: loaded {[r['loaded'] for r in results]}")
