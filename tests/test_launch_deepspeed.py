"""``zeroscope run`` with the DeepSpeed launcher's flags runs the job the way ``deepspeed`` does
(the same script output: each rank's losses and the ``--local_rank`` the launcher passes) and
records every rank's every step. The reference is DeepSpeed's own launcher on the same script,
2 CPU ranks (``DS_ACCELERATOR=cpu``, gloo). With ``--as-deepspeed`` the launcher's processes keep
the real DeepSpeed (they are DeepSpeed) and the ranks get the bundled engine, as under torchrun's
flags (the reference: ``zeroscope run --as-deepspeed --nproc-per-node 2``, the same script)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.attach_support import read_trace
from tests.distributed import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "scripts" / "ds_launcher_train.py"
STEPS = 4
CONFIG = {
    "train_micro_batch_size_per_gpu": 4,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}},
    "zero_optimization": {"stage": 2},
}


ZEROSCOPE_RUN = [sys.executable, "-m", "zeroscope", "run", "--headless", "--record", "t.zstrace"]


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch-extensions"))
    return env


def _free_port() -> str:
    return str(free_port())


def _losses(stdout: str) -> list[str]:
    return sorted(line for line in stdout.splitlines() if line.startswith("LOSS "))


def _script_args(tmp: Path) -> list[str]:
    config = tmp / "ds.json"
    config.write_text(json.dumps(CONFIG))
    return [str(SCRIPT), "--steps", str(STEPS), "--deepspeed", "--deepspeed_config", str(config)]


def _run_all(
    tmp: Path, argvs: list[tuple[str, list[str]]]
) -> dict[str, subprocess.CompletedProcess[str]]:
    out = {}
    for name, argv in argvs:
        out[name] = subprocess.run(
            [*argv, *_script_args(tmp)],
            cwd=tmp,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert out[name].returncode == 0, out[name].stdout[-3000:] + out[name].stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess[str]]:
    tmp = tmp_path_factory.mktemp("ds-launcher")
    # `deepspeed --num_gpus 2 train.py ...`: the `deepspeed` command is this module's main().
    launcher = [sys.executable, "-m", "deepspeed.launcher.runner"]
    out = _run_all(
        tmp,
        [
            ("deepspeed", [*launcher, "--num_gpus", "2", "--master_port", _free_port()]),
            ("zeroscope", [*ZEROSCOPE_RUN, "--num_gpus", "2", "--master_port", _free_port()]),
        ],
    )
    out["trace"] = tmp / "t.zstrace"  # type: ignore[assignment]
    return out


@pytest.fixture(scope="module")
def alias_runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, subprocess.CompletedProcess[str]]:
    """``--as-deepspeed`` under the launcher's flags, and under torchrun's (the reference)."""
    tmp = tmp_path_factory.mktemp("ds-launcher-alias")
    alias = [*ZEROSCOPE_RUN[:-2], "--as-deepspeed", "--record"]
    out = _run_all(
        tmp,
        [
            ("alias", [*alias, "a.zstrace", "--num_gpus", "2", "--master_port", _free_port()]),
            (
                "alias-torchrun",
                [*alias, "b.zstrace", "--nproc-per-node", "2", "--master_port", _free_port()],
            ),
        ],
    )
    out["alias-trace"] = tmp / "a.zstrace"  # type: ignore[assignment]
    return out


def test_the_script_prints_what_it_prints_under_deepspeed(runs: dict) -> None:
    ours, theirs = _losses(runs["zeroscope"].stdout), _losses(runs["deepspeed"].stdout)
    assert len(theirs) == 2 * STEPS
    assert ours == theirs, runs["zeroscope"].stdout[-4000:]
    # DeepSpeed's launcher ran the ranks: each got --local_rank=N, as under `deepspeed`.
    assert {line.split("local_rank_arg ")[1] for line in ours} == {
        "0 LOCAL_RANK 0",
        "1 LOCAL_RANK 1",
    }


def test_the_launchers_output_names_no_variable_zeroscope_sets(runs: dict) -> None:
    """DeepSpeed's launch.py logs every environment variable whose name holds "NCCL": the
    attach's switches are set in each rank's process, never in the launcher's, so its lines
    are those of the run without zeroscope."""
    from zeroscope.agent.attach.flight_recorder import BUFFER_ENV, TIMING_ENV

    for name in (TIMING_ENV, BUFFER_ENV):
        ours, theirs = (runs[k].stdout + runs[k].stderr for k in ("zeroscope", "deepspeed"))
        assert ours.count(name) == theirs.count(name), name


def test_the_trace_has_both_ranks_and_every_step(runs: dict) -> None:
    trace = read_trace(runs["trace"])
    assert sorted(r for r in trace if r >= 0) == [0, 1]
    for rank in (0, 1):
        assert [s.step for s in trace[rank].steps] == list(range(1, STEPS + 1))
    lines = [ln for ln in runs["zeroscope"].stdout.splitlines() if ln.startswith("step ")]
    assert len(lines) == STEPS
    assert "job exit code 0" in runs["zeroscope"].stdout


def _values(stdout: str) -> list[tuple[str, str, str]]:
    """(rank, step, loss) of each LOSS line: what does not depend on the launcher."""
    return sorted((ln.split()[2], ln.split()[4], ln.split()[5]) for ln in _losses(stdout))


def test_as_deepspeed_with_the_launchers_flags_runs_the_bundled_engine(
    runs: dict, alias_runs: dict
) -> None:
    ours = alias_runs["alias"].stdout
    # the same losses as under torchrun's flags with the alias, and the launcher's --local_rank
    assert len(_values(ours)) == 2 * STEPS
    assert _values(ours) == _values(alias_runs["alias-torchrun"].stdout), ours[-4000:]
    assert {ln.split("local_rank_arg ")[1] for ln in _losses(ours)} == {
        "0 LOCAL_RANK 0",
        "1 LOCAL_RANK 1",
    }
    trace = read_trace(alias_runs["alias-trace"])
    assert sorted(r for r in trace if r >= 0) == [0, 1]
    for rank in (0, 1):
        assert [s.step for s in trace[rank].steps] == list(range(1, STEPS + 1))
    # the ranks ran the bundled engine (the header names it), not DeepSpeed
    engines = {h.engine for r in (0, 1) for h in trace[r].hellos}
    plain = {h.engine for r in (0, 1) for h in read_trace(runs["trace"])[r].hellos}
    assert engines and engines.isdisjoint(plain), (engines, plain)


def test_the_launchers_processes_keep_the_real_deepspeed(tmp_path: Path) -> None:
    """Under the alias's switch, ``python -m deepspeed.launcher.runner`` (and launch) still
    import DeepSpeed's launcher, while a script's ``import deepspeed`` gets the bundled engine."""
    from zeroscope.run.as_deepspeed import alias_environment

    env = alias_environment(_env())
    for module in ("deepspeed.launcher.runner", "deepspeed.launcher.launch"):
        done = subprocess.run(
            [sys.executable, "-u", "-m", module, "--help"],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
    probe = "import deepspeed; print('DEEPSPEED', deepspeed.__name__)"
    done = subprocess.run(
        [sys.executable, "-u", "-c", probe],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert "DEEPSPEED zeroscope.engine.deepspeed" in done.stdout, done.stderr[-2000:]


def test_two_no_ssh_nodes_report_to_node_0(runs: dict, tmp_path: Path) -> None:
    """DeepSpeed's multi-node form without ssh (``--no_ssh --node_rank N``, every node runs the
    launcher itself), simulated with two nodes on this machine: node 0's zeroscope hosts the
    collector, node 1's ranks report to it with the shared token; the losses are the one-node
    run's (the same 2 ranks, their gradients averaged alike)."""
    (tmp_path / "ds.json").write_text(json.dumps(CONFIG))
    (tmp_path / "hostfile").write_text("node-a slots=1\nnode-b slots=1\n")
    master, port = _free_port(), _free_port()
    env = dict(_env(), ZEROSCOPE_TOKEN="feedface" * 4, ZEROSCOPE_HOME=str(tmp_path / "zh"))
    env.pop("ZEROSCOPE_JOB_ID", None)
    script_args = [str(SCRIPT), "--steps", str(STEPS), "--deepspeed", "--deepspeed_config"]
    nodes = []
    for node in (1, 0):  # either order
        argv = [
            *(sys.executable, "-m", "zeroscope", "run", "--headless", "--port", port),
            *("--record", f"n{node}.zstrace", "--hostfile", "hostfile", "--no_ssh"),
            *("--num_nodes", "2", "--node_rank", str(node), "--master_addr", "127.0.0.1"),
            *("--master_port", master, *script_args, "ds.json"),
        ]
        nodes.append(
            subprocess.Popen(
                argv,
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outs = [p.communicate(timeout=900)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    # (each node's one rank is its local rank 0: the LOSS lines differ there, not in the loss)
    assert _values(outs[0] + outs[1]) == _values(runs["deepspeed"].stdout)
    trace = read_trace(tmp_path / "n0.zstrace")
    assert sorted(r for r in trace if r >= 0) == [0, 1]
    for rank in (0, 1):
        assert [s.step for s in trace[rank].steps] == list(range(1, STEPS + 1))
    assert not (tmp_path / "n1.zstrace").exists()  # node 1 hosts no collector
