"""``zeroscope run``'s DeepSpeed launcher flags, checked against DeepSpeed's own parser (the
oracle is ``deepspeed.launcher.runner.parse_args`` of the installed DeepSpeed), and the choice
between the two launchers."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from deepspeed.launcher import runner

from zeroscope.cli import build_parser, main
from zeroscope.run.deepspeed_launcher import (
    DEEPSPEED_MODULE,
    DEEPSPEED_ONLY_OPTIONS,
    SHARED_OPTIONS,
    deepspeed_argv,
    uses_deepspeed_launcher,
)
from zeroscope.run.launch import TORCHRUN_MODULE, TORCHRUN_OPTIONS


def _deepspeed_options() -> dict[frozenset[str], bool]:
    """DeepSpeed's launcher options: their spellings -> whether they take a value. Its parser is
    built inside parse_args; we catch it there."""
    caught: list[argparse.ArgumentParser] = []
    real = argparse.ArgumentParser.parse_args

    def catch(self: argparse.ArgumentParser, *a: Any, **k: Any) -> Any:
        caught.append(self)
        return real(self, *a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(argparse.ArgumentParser, "parse_args", catch)
        runner.parse_args(["train.py"])
    out = {}
    for action in caught[0]._actions:
        if action.option_strings and not isinstance(action, argparse._HelpAction):
            out[frozenset(action.option_strings)] = action.nargs != 0
    return out


def test_every_deepspeed_launcher_option_is_known() -> None:
    ours = {frozenset(names): takes_value for names, takes_value in DEEPSPEED_ONLY_OPTIONS}
    ours.update({frozenset([name]): takes_value for name, takes_value in SHARED_OPTIONS})
    assert ours == _deepspeed_options()
    # The shared ones are torchrun's too (one destination, either launcher).
    torchrun_names = {n for names, _ in TORCHRUN_OPTIONS for n in names}
    assert {name for name, _ in SHARED_OPTIONS} <= torchrun_names


USER_ARGVS = [
    # (DeepSpeed launcher flags as a user types them, the script's arguments)
    (["--num_gpus", "2"], ["--deepspeed", "--deepspeed_config", "ds.json"]),
    (["--num_gpus=4", "--num_nodes", "2", "-H", "/tmp/hosts", "--master_port", "29601"], []),
    (["--include", "localhost:0,2", "--master_addr", "10.0.0.1", "--launcher", "openmpi"], []),
    (["-e", "worker-1:0", "--launcher_args", "--x 1", "--no_local_rank", "--module"], ["-v"]),
    (["--num_accelerators", "1", "--no_ssh", "--node_rank", "1", "--force_multi"], []),
    (["--num_gpus", "1", "--enable_each_rank_log", "/tmp/l", "--bind_cores_to_rank"], []),
    (["-i", "h:0", "--bind_core_list", "1,3-5", "--ssh_port", "2222", "--no_python"], []),
    (["--num_gpus", "1", "--venv_script", "a.sh", "--log_level", "warning", "-q"], []),
    (["--num_gpus", "1", "--save_pid", "--no_ssh_check", "--autotuning", "run"], ["--num_gpus"]),
]


@pytest.mark.parametrize(("flags", "script_args"), USER_ARGVS)
def test_deepspeeds_launcher_reads_what_the_user_typed(
    flags: list[str], script_args: list[str]
) -> None:
    args = build_parser("run").parse_args(["run", *flags, "train.py", *script_args])
    assert uses_deepspeed_launcher(args)
    argv = deepspeed_argv(args, args.script, args.script_args)
    assert argv[1:3] == ["-m", DEEPSPEED_MODULE]
    expected = runner.parse_args([*flags, "train.py", *script_args])
    assert runner.parse_args(argv[3:]) == expected
    assert argv[argv.index("train.py") + 1 :] == script_args


def test_torchruns_flags_alone_still_pick_torchrun() -> None:
    from zeroscope.commands.run import _launcher_argv

    args = build_parser("run").parse_args(
        ["run", "--nproc-per-node", "2", "--master_port", "29601", "train.py"]
    )
    assert not uses_deepspeed_launcher(args)
    assert _launcher_argv(args, "train.py")[1:3] == ["-m", TORCHRUN_MODULE]


def test_flags_no_single_launcher_takes_are_refused(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    flags = ["--num_gpus", "2", "--nproc-per-node", "2"]
    assert main(["run", "--headless", *flags, str(script)]) == 2
    assert "--nproc-per-node is torchrun's" in capsys.readouterr().err


def test_no_ssh_nodes_plan_one_collector_on_node_0(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--no_ssh --node_rank N``: each node runs the launcher itself; ``--num_nodes`` says how
    many, and node 0 hosts the collector where ``--master_addr`` reaches it, as with torchrun's
    ``--nnodes``/``--node-rank`` (the same plan, zeroscope/remote/multinode.py)."""
    from zeroscope.remote.multinode import plan_from_run_args

    monkeypatch.setenv("ZEROSCOPE_TOKEN", "t" * 32)
    monkeypatch.delenv("ZEROSCOPE_JOB_ID", raising=False)
    common = ["run", "--no_ssh", "-H", "hf", "--master_addr", "10.0.0.1", "--master_port", "29600"]

    def plan(*flags: str) -> Any:
        return plan_from_run_args(build_parser("run").parse_args([*common, *flags, "train.py"]))

    node0, node1 = (
        plan("--num_nodes", "2", "--node_rank", "0"),
        plan("--num_nodes=2", "--node_rank=1"),
    )
    assert (node0.hosts_collector, node0.bind_host, node0.port) == (True, "0.0.0.0", 29601)
    assert not node1.hosts_collector
    assert node1.rank_env()["ZEROSCOPE_COLLECTOR"] == "tcp://10.0.0.1:29601"
    assert node0.job_id == node1.job_id
    with pytest.raises(ValueError, match="needs --num_nodes"):
        plan("--node_rank", "1")
    assert plan("--node_rank", "0").bind_host == "127.0.0.1"  # one node: as before
