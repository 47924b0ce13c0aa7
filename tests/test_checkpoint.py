"""save_checkpoint / load_checkpoint / zero_to_fp32 on 2 gloo ranks.

Stop at step K, save, build a fresh engine from a *different* random init, load, continue to
step N: the losses equal the uninterrupted run's bit for bit (fp32 on CPU), for stages 1, 2, 3,
with optimizer offload, with fp16's dynamic loss scaler and with an LR schedule. A save killed
midway leaves the previous checkpoint loadable. The consolidated fp32 state_dict loads into the
plain model and equals the trained weights."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.distributed import run_ranks
from tests.models import TinyGPT
from tests.offload_support import build, ds_config, train

K, N = 3, 6
SCHEDULER = {"type": "WarmupLR", "params": {"warmup_num_steps": 5, "warmup_type": "linear"}}


def _cases(tmp: str) -> dict[str, dict[str, Any]]:
    def cfg(stage: int, precision: str = "fp32", **zero: Any) -> dict[str, Any]:
        c = ds_config(stage, precision, **zero)
        c["scheduler"] = SCHEDULER
        return c

    return {
        "s1": cfg(1),
        "s2": cfg(2),
        "s3": cfg(3, stage3_param_persistence_threshold=50),
        "s2-fp16": {**cfg(2, "fp16"), "fp16": {"enabled": True, "initial_scale_power": 8}},
        "s2-offload": cfg(2, offload_optimizer={"device": "cpu"}),
        "s3-nvme": cfg(
            3,
            offload_optimizer={"device": "nvme", "nvme_path": tmp, "buffer_count": 2},
            sub_group_size=900,
        ),
    }


def _weights(run: Any) -> dict[str, torch.Tensor]:
    strategy = run.engine.strategy
    if run.engine.zero_optimization_stage() == 3:
        return strategy.consolidated_16bit_state_dict() or {}
    return {k: v.detach().clone() for k, v in run.engine.module.state_dict().items()}


def _resume_ranks(rank: int, world: int, tmp: str) -> dict[str, Any]:
    import torch.distributed as dist

    from zeroscope.engine.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    dist.init_process_group("gloo")
    out: dict[str, Any] = {}
    for name, config in _cases(tmp).items():
        whole = train(build(config), rank, world, range(N))
        first = build(config)
        before = train(first, rank, world, range(K))
        ckpt = os.path.join(tmp, name)
        assert first.engine.save_checkpoint(ckpt, client_state={"data_position": K})
        first.engine.destroy()
        second = build(config, seed=1)  # another init: everything must come from the files
        path, client = second.engine.load_checkpoint(ckpt)
        after = train(second, rank, world, range(K, N))
        weights = _weights(second)
        result: dict[str, Any] = {
            "losses": (before + after, whole),
            "path": path,
            "client": client,
            "steps": second.engine.global_steps,
            "lr": second.engine.get_lr(),
        }
        second.engine.save_checkpoint(ckpt, tag="final")
        if rank == 0:
            consolidated = get_fp32_state_dict_from_zero_checkpoint(ckpt)
            plain = TinyGPT()
            plain.load_state_dict(consolidated)  # strict: every key, right shapes
            result["consolidated_equal"] = all(
                torch.equal(consolidated[k].to(v.dtype), v) for k, v in weights.items()
            )
        second.engine.destroy()
        out[name] = result
    return out


@pytest.fixture(scope="module")
def resumed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = str(tmp_path_factory.mktemp("ckpt"))
    return run_ranks(_resume_ranks, 2, tmp, timeout=240)[0]


@pytest.mark.parametrize("name", list(_cases("")))
def test_resume_continues_bit_for_bit(resumed: dict[str, Any], name: str) -> None:
    r = resumed[name]
    got, want = r["losses"]
    assert got == want
    assert r["path"].endswith(f"global_step{K}")
    assert r["client"] == {"data_position": K}
    assert r["steps"] == N


@pytest.mark.parametrize("name", list(_cases("")))
def test_zero_to_fp32_gives_the_trained_weights(resumed: dict[str, Any], name: str) -> None:
    assert resumed[name]["consolidated_equal"]


def test_zero_to_fp32_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = build(ds_config(2))
    train(run, 0, 1, range(2))
    run.engine.save_checkpoint(str(tmp_path / "ck"))
    out = tmp_path / "fp32.pt"
    done = subprocess.run(
        [sys.executable, "-m", "zeroscope.engine.zero_to_fp32", str(tmp_path / "ck"), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    state = torch.load(out, weights_only=True)
    assert torch.equal(state["head.weight"], run.engine.module.tok.weight.detach())
    from zeroscope.engine.zero_to_fp32 import main

    assert main([str(tmp_path / "nope"), str(out)]) == 1
    assert "has no 'latest' file" in capsys.readouterr().err


def test_load_refuses_another_stage_and_reports_nothing_to_load(tmp_path: Path) -> None:
    run = build(ds_config(2))
    train(run, 0, 1, range(1))
    run.engine.save_checkpoint(str(tmp_path))
    other = build(ds_config(1))
    with pytest.raises(ValueError, match=r"saved at ZeRO stage 2 on 1 ranks; this run is stage 1"):
        other.engine.load_checkpoint(str(tmp_path))
    assert other.engine.load_checkpoint(str(tmp_path / "empty")) == (None, None)


_KILLED = textwrap.dedent(
    """
    import os, sys
    from tests.offload_support import build, ds_config, train
    run = build(ds_config(2))
    train(run, 0, 1, range(2))
    run.engine.save_checkpoint(sys.argv[1], tag="a", client_state={"at": 2})
    print("saved", flush=True)
    train(run, 0, 1, range(2, 3))
    os.environ["ZEROSCOPE_CHECKPOINT_TEST_SLEEP"] = "60"
    run.engine.save_checkpoint(sys.argv[1], tag="b")
    """
)


def test_a_save_killed_midway_leaves_the_previous_checkpoint_loadable(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "saved"
        partial = tmp_path / ".b.tmp"
        deadline = time.monotonic() + 60
        while not (partial.is_dir() and any(partial.iterdir())) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(partial.iterdir()), "the second save never started writing"
    finally:
        proc.kill()
        proc.wait()
    assert (tmp_path / "latest").read_text() == "a"
    assert not (tmp_path / "b").exists()
    run = build(ds_config(2), seed=5)
    path, client = run.engine.load_checkpoint(str(tmp_path))
    assert path == str(tmp_path / "a") and client == {"at": 2}
    assert run.engine.global_steps == 2
    # and it continues exactly like a run that never stopped
    whole = train(build(ds_config(2)), 0, 1, range(3))
    assert train(run, 0, 1, range(2, 3)) == whole[2:]


@pytest.mark.parametrize(("stage", "precision"), [(0, "fp32"), (2, "bf16")])
def test_one_process_round_trip(tmp_path: Path, stage: int, precision: str) -> None:
    """Stage 0 (every rank saves the whole state) and bf16 (``bf16_`` file names, 16-bit
    module weights beside fp32 masters) resume exactly and consolidate to fp32."""
    from zeroscope.engine.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    config = ds_config(stage, precision)
    whole = train(build(config), 0, 1, range(3))
    first = build(config)
    train(first, 0, 1, range(2))
    first.engine.save_checkpoint(str(tmp_path))
    # DeepSpeed 0.19.8's names: stage 0 keeps its optimizer in the one model-states file.
    want = {"mp_rank_00_model_states.pt"}
    if stage:
        want.add(
            f"{'bf16_' if precision == 'bf16' else ''}zero_pp_rank_0_mp_rank_00_optim_states.pt"
        )
    assert {p.name for p in (tmp_path / "global_step2").iterdir()} == want
    second = build(config, seed=3)
    second.engine.load_checkpoint(str(tmp_path))
    assert train(second, 0, 1, range(2, 3)) == whole[2:]
    state = get_fp32_state_dict_from_zero_checkpoint(str(tmp_path))
    assert all(t.dtype == torch.float32 for t in state.values())
    masters = first.engine.strategy.state_dict()["shards"][0]["master"]
    flat = torch.cat([state[n].reshape(-1) for n, _ in first.engine.module.named_parameters()])
    assert torch.equal(flat.sort().values, masters[: flat.numel()].sort().values)
    TinyGPT().load_state_dict(state)


def test_load_module_only_starts_a_fresh_optimizer_from_the_weights(tmp_path: Path) -> None:
    run = build(ds_config(1))
    train(run, 0, 1, range(2))
    run.engine.save_checkpoint(str(tmp_path))
    saved = {k: v.detach().clone() for k, v in run.engine.module.state_dict().items()}
    other = build(ds_config(1), seed=7)
    path, _ = other.engine.load_checkpoint(str(tmp_path), load_module_only=True)
    assert path is not None and other.engine.global_steps == 0
    got = other.engine.module.state_dict()
    assert all(torch.equal(got[k], v) for k, v in saved.items())
    shard = other.engine.strategy.state_dict()["shards"][0]
    assert shard["step"] == 0 and not shard["exp_avg"].any()
    flat = torch.cat(
        [p.detach().reshape(-1) for p in reversed(list(other.engine.module.parameters()))]
    )
    assert torch.equal(shard["master"][: flat.numel()], flat)  # masters follow the weights
