"""CPU and NVMe offload on 2 gloo ranks: the same losses as without offload (bitwise in fp32),
O bytes off the device equal to the formula, every copy and file transfer counted, swap files
present during training and gone after, and clear errors for a full or unusable disk."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.distributed import run_ranks
from tests.models import TinyGPT
from tests.offload_support import build, ds_config, padded_shard_elements, train

STEPS = 4


def _cases(tmp: str) -> list[tuple[str, int, str, dict[str, Any]]]:
    nvme_opt = {"device": "nvme", "nvme_path": tmp, "buffer_count": 2}
    small = {"stage3_param_persistence_threshold": 0}
    return [
        # (name, stage, precision, zero_optimization extras)
        ("s1-cpu", 1, "fp32", {"offload_optimizer": {"device": "cpu"}}),
        ("s2-cpu", 2, "fp32", {"offload_optimizer": {"device": "cpu"}}),
        ("s2-cpu-bf16", 2, "bf16", {"offload_optimizer": {"device": "cpu"}}),
        ("s2-nvme", 2, "fp32", {"offload_optimizer": nvme_opt, "sub_group_size": 700}),
        ("s3-cpu", 3, "fp32", {**small, "offload_optimizer": {"device": "cpu"}}),
        ("s3-nvme", 3, "fp32", {**small, "offload_optimizer": nvme_opt, "sub_group_size": 500}),
        (
            "s3-param-cpu",
            3,
            "fp32",
            {**small, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}},
        ),
        (
            "s3-param-nvme",
            3,
            "bf16",
            {
                **small,
                "offload_optimizer": nvme_opt,
                "offload_param": {"device": "nvme", "nvme_path": tmp},
                "sub_group_size": 1000,
            },
        ),
        ("s3-param-only", 3, "bf16", {**small, "offload_param": {"device": "cpu"}}),
    ]


def _strip(zero: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in zero.items() if not k.startswith("offload")}


def _offload_ranks(rank: int, world: int, tmp: str) -> dict[str, Any]:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    out: dict[str, Any] = {}
    for name, stage, precision, zero in _cases(tmp):
        plain = build(ds_config(stage, precision, **_strip(zero)))
        base = train(plain, rank, world, range(STEPS))
        run = build(ds_config(stage, precision, **zero))
        try:
            losses = train(run, rank, world, range(STEPS))
        except Exception as exc:
            raise AssertionError(f"case {name}") from exc
        rec = run.recorder
        files = sorted(p.name for p in Path(tmp).glob(f"zeroscope-{os.getpid()}-*/*.swp"))
        result = {
            "same": losses == base,
            "losses": (losses, base),
            "memory": rec.steps[-1].memory,
            "plain_memory": plain.recorder.steps[-1].memory,
            "bytes": {
                d: rec.bytes_in_step(STEPS - 1, d)
                for d in ("d2h", "h2d", "nvme_read", "nvme_write")
            },
            "files_during": files,
            "positive_times": all(e >= s for t in rec.transfers for _, _, s, e in t),
        }
        run.engine.destroy()
        result["files_after"] = sorted(
            p.name for p in Path(tmp).glob(f"zeroscope-{os.getpid()}-*/*")
        )
        out[name] = result
    # Two NVMe engines of one process on one nvme_path, stepped in turn, keep apart.
    cfg = ds_config(2, offload_optimizer={"device": "nvme", "nvme_path": tmp})
    first, second = build(cfg), build(cfg, seed=1)
    for k in range(STEPS):
        train(first, rank, world, range(k, k + 1))
        train(second, rank, world, range(k, k + 1))
    out["two-engines"] = first.losses == out["s2-cpu"]["losses"][1]
    first.engine.destroy()
    second.engine.destroy()
    return out


@pytest.fixture(scope="module")
def offload_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = str(tmp_path_factory.mktemp("nvme"))
    return run_ranks(_offload_ranks, 2, tmp, timeout=240)[0]


ALL = [c[0] for c in _cases("")]


@pytest.mark.parametrize("name", ALL)
def test_losses_equal_the_run_without_offload(offload_results: dict, name: str) -> None:
    r = offload_results[name]
    assert r["same"], r["losses"]


@pytest.mark.parametrize("name", [n for n in ALL if n != "s3-param-only"])
def test_optimizer_state_is_off_the_device_and_matches_the_formula(
    offload_results: dict, name: str
) -> None:
    stage = 3 if name.startswith("s3") else int(name[1])
    shard = padded_shard_elements(TinyGPT(), stage, 2)
    mem = offload_results[name]["memory"]
    assert mem.optim == 0
    assert mem.host_grads == 4 * shard  # the fp32 gradient shard copied off the device
    if "nvme" in name:
        assert mem.nvme_bytes >= 12 * shard
        # only the staging pool: buffer_count x 12 bytes x the largest sub-group unit
        unit = {"s2-nvme": 700, "s3-nvme": 500, "s3-param-nvme": 1000}[name]
        assert mem.host_optim == 2 * 12 * unit
    else:
        assert mem.host_optim == 12 * shard
        assert mem.nvme_bytes == 0


def test_copies_are_counted_per_step(offload_results: dict) -> None:
    shard = padded_shard_elements(TinyGPT(), 2, 2)
    got = offload_results["s2-cpu"]["bytes"]
    # grads down in fp32, updated fp32 masters up into the parameter shard
    assert got == {"d2h": 4 * shard, "h2d": 4 * shard, "nvme_read": 0, "nvme_write": 0}
    assert all(offload_results[n]["positive_times"] for n in ALL)


def test_engines_sharing_an_nvme_path_keep_separate_files(offload_results: dict) -> None:
    assert offload_results["two-engines"]


@pytest.mark.parametrize("name", ["s2-nvme", "s3-nvme"])
def test_nvme_reads_and_writes_exactly_the_optimizer_state(
    offload_results: dict, name: str
) -> None:
    stage = 3 if name.startswith("s3") else 2
    shard = padded_shard_elements(TinyGPT(), stage, 2)
    r = offload_results[name]
    assert r["bytes"]["nvme_read"] == 12 * shard
    assert r["bytes"]["nvme_write"] == 12 * shard
    assert len(r["files_during"]) > 1  # several sub-group units
    assert r["memory"].nvme_bytes == 12 * shard
    assert r["files_after"] == []


def test_param_offload_keeps_16bit_shards_off_the_device(offload_results: dict) -> None:
    shard = padded_shard_elements(TinyGPT(), 3, 2)
    cpu, nvme = offload_results["s3-param-cpu"], offload_results["s3-param-nvme"]
    plain = cpu["plain_memory"]
    assert plain.params == 4 * shard  # fp32 shards on the device without offload
    assert cpu["memory"].params == 0 and cpu["memory"].host_params == 4 * shard
    assert nvme["memory"].params == 0
    assert nvme["memory"].nvme_bytes == 12 * shard + 2 * shard  # O + bf16 P
    assert "params.swp" in nvme["files_during"]
    assert nvme["bytes"]["h2d"] > 0  # shards brought in for the gathers
    only = offload_results["s3-param-only"]["memory"]
    assert only.host_params == 2 * shard and only.optim == 12 * shard and only.host_optim == 0


# -- disks that cannot take the files -------------------------------------------------------


def test_unusable_nvme_path_names_path_and_bytes(tmp_path: Path) -> None:
    from zeroscope.agent.api import NullTelemetry
    from zeroscope.engine.nvme import NvmeError, NvmeSwapper

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    swapper = NvmeSwapper(str(blocker / "sub"), rank=0, purpose="optim", tel=NullTelemetry())
    with pytest.raises(NvmeError, match=r"a-file/sub.*not usable.*1234 bytes"):
        swapper.allocate({"u": 1234})


def test_too_little_free_space_is_refused_before_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    from zeroscope.agent.api import NullTelemetry
    from zeroscope.engine.nvme import NvmeError, NvmeSwapper

    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=1000))
    swapper = NvmeSwapper(str(tmp_path), rank=0, purpose="optim", tel=NullTelemetry())
    with pytest.raises(NvmeError, match=r"has 1000 bytes free but the swap files need 4096 bytes"):
        swapper.allocate({"a": 2048, "b": 2048})
    assert list(tmp_path.iterdir()) == []


def test_full_disk_mid_write_keeps_the_previous_file(tmp_path: Path) -> None:
    from zeroscope.agent.api import NullTelemetry
    from zeroscope.engine.nvme import NvmeError, NvmeSwapper

    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full to produce ENOSPC")
    swapper = NvmeSwapper(str(tmp_path), rank=0, purpose="optim", tel=NullTelemetry())
    swapper.allocate({"u": 16})
    old = torch.arange(4, dtype=torch.float32)
    swapper.write("u", old)
    # The next write of unit u lands on a full device (its temporary file is /dev/full).
    os.symlink("/dev/full", swapper.path("u").with_suffix(".tmp"))
    with pytest.raises(NvmeError, match=r"is full: writing 16 bytes to .*u.swp"):
        swapper.write("u", torch.full((4,), 7.0))
    back = torch.empty(4)
    swapper.read("u", back)
    assert torch.equal(back, old)
    swapper.close()
    assert not swapper.dir.exists()


_EXITS = """
import sys
from tests.offload_support import build, ds_config, train
run = build(ds_config(2, offload_optimizer={"device": "nvme", "nvme_path": sys.argv[1]}))
train(run, 0, 1, range(1))
print(run.engine.strategy.store.swapper.dir, flush=True)
"""


def test_swap_files_are_removed_at_interpreter_exit(tmp_path: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _EXITS, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert done.returncode == 0, done.stderr
    folder = Path(done.stdout.strip())
    assert folder.parent == tmp_path and folder.name.startswith("zeroscope-")
    assert not folder.exists()
