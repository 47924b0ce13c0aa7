"""The ZeRO formulas against the paper's worked example and against first principles, and the
``zeroscope estimate`` verb that prints them."""

from __future__ import annotations

import pytest

from zeroscope.cli import main
from zeroscope.state import bandwidth, formulas

PSI = 7.5e9


@pytest.mark.parametrize(("stage", "paper_gb"), [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_paper_figure_1_per_rank_model_states(stage: int, paper_gb: float) -> None:
    m = formulas.model_state_bytes(PSI, 64, stage)
    assert round(m.device_total / formulas.GB, 1) == paper_gb
    assert m.host_total == 0


def test_parts_add_up_to_sixteen_bytes_per_parameter_on_one_rank() -> None:
    for stage in range(4):
        m = formulas.model_state_bytes(1000, 1, stage)
        assert (m.params, m.grads, m.optim) == (2000, 2000, 12000)


def test_fp32_has_no_master_copy() -> None:
    m = formulas.model_state_bytes(1000, 1, 0, precision="fp32")
    assert (m.params, m.grads, m.optim) == (4000, 4000, 8000)


def test_offload_matches_deepspeed_estimators() -> None:
    # DeepSpeed: stage 2 + optimizer offload keeps 2Ψ on the device; stage 3 + optimizer
    # offload keeps 2Ψ/N; stage 3 with both offloaded keeps nothing of the model states.
    n = 8
    s2 = formulas.model_state_bytes(PSI, n, 2, offload_optimizer="cpu")
    assert s2.device_total == 2 * PSI
    # The host gradient partition is fp32, as DeepSpeed's CPU Adam consumes it.
    assert s2.host_optim == 12 * PSI / n and s2.host_grads == 4 * PSI / n
    s3 = formulas.model_state_bytes(PSI, n, 3, offload_optimizer="cpu")
    assert s3.device_total == 2 * PSI / n
    # Persistent (never released) stage-3 parameters are held whole by every rank, beside
    # their shard.
    s3p = formulas.model_state_bytes(PSI, n, 3, persistent=1e6)
    assert s3p.params == 2 * (PSI / n + 1e6) and s3p.grads == 2 * PSI / n
    # fp32 with offload: the host holds a separate fp32 master, so O is 12 bytes, not 8.
    f32 = formulas.model_state_bytes(PSI, n, 2, precision="fp32", offload_optimizer="cpu")
    assert f32.host_optim == 12 * PSI / n and f32.optim == 0 and f32.params == 4 * PSI
    both = formulas.model_state_bytes(PSI, n, 3, offload_optimizer="nvme", offload_param="cpu")
    # Everything offloaded: 2 (P) + 4 (fp32 G) + 12 (O) = DeepSpeed's 18Ψ/N.
    assert both.device_total == 0 and both.total == 18 * PSI / n


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"stage": 4}, "stage"),
        ({"ranks": 0}, "world size"),
        ({"stage": 2, "offload_param": "cpu"}, "offload_param"),
        ({"stage": 0, "offload_optimizer": "cpu"}, "offload_optimizer"),
        ({"precision": "fp8"}, "precision"),
    ],
)
def test_bad_configs_name_the_problem(kwargs: dict, needle: str) -> None:
    args = {"psi": 10, "ranks": 2, "stage": 1, **kwargs}
    with pytest.raises(ValueError, match=needle):
        formulas.model_state_bytes(**args)


def test_communication_volume_is_two_or_three_psi() -> None:
    assert [formulas.comm_elements_per_step(10, s) for s in range(4)] == [20, 20, 20, 30]
    assert formulas.comm_bytes_per_step(10, 3, "bf16") == 60
    # An all-reduce is a reduce-scatter plus an all-gather of the same size.
    assert bandwidth.volume("all_reduce", 8) == bandwidth.volume(
        "reduce_scatter", 8
    ) + bandwidth.volume("all_gather", 8)


def _rows(out: str) -> list[list[str]]:
    """The table's data rows, split into cells (two lines of title, one of column names)."""
    return [row.split() for row in out.splitlines()[3:]]


def test_estimate_prints_the_paper_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--params", "7.5B", "--ranks", "64"]) == 0
    device = [row[4] for row in _rows(capsys.readouterr().out)]
    assert device == ["120GB", "31.4GB", "16.6GB", "1.9GB"]


def test_estimate_single_stage_with_offload(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["estimate", "--params", "1e9", "--ranks", "4", "--stage", "3", "--offload", "cpu"]
    assert main(argv) == 0
    (row,) = _rows(capsys.readouterr().out)
    stage, p, g, o, device, host, nvme, comm, sent = row
    # 1e9 params on 4 ranks: device P 2Ψ/N = 0.5 GB (and nothing else on the device); host
    # fp32 G + O 16Ψ/N = 4.0 GB; nothing on NVMe; 3Ψ fp16 = 6 GB per step, of which each rank
    # sends 3/4 on a ring.
    assert (stage, p, g, o, device, host, nvme, comm, sent) == (
        "3", "500MB", "0B", "0B", "500MB", "4.0GB", "0B", "6.0GB", "4.5GB"
    )  # fmt: skip


def test_estimate_small_models_never_print_zero(capsys: pytest.CaptureFixture[str]) -> None:
    # 1e6 parameters: every part is kilobytes to megabytes; a fixed-GB column printed "0.0".
    assert main(["estimate", "--params", "1e6", "--ranks", "64", "--stage", "3"]) == 0
    (row,) = _rows(capsys.readouterr().out)
    assert row[1:] == ["31.2KB", "31.2KB", "188KB", "250KB", "0B", "0B", "6.0MB", "5.9MB"]


def test_estimate_counts_nvme_apart_from_host_memory(capsys: pytest.CaptureFixture[str]) -> None:
    # ZeRO-Infinity as DeepSpeed places it: optimizer states and the parameter shard on NVMe,
    # the fp32 gradient shard in host memory (4Ψ/N).
    argv = ["estimate", "--params", "8e9", "--ranks", "8", "--stage", "3",
            "--offload", "nvme", "--offload-param", "nvme"]  # fmt: skip
    assert main(argv) == 0
    (row,) = _rows(capsys.readouterr().out)
    device, host, nvme = row[4:7]
    assert (device, host, nvme) == ("0B", "4.0GB", "14.0GB")  # 4Ψ/N; 12Ψ/N + 2Ψ/N


def test_one_rank_sends_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    """A step's collectives on one rank keep their message sizes (2Ψ: DeepSpeed still calls
    them) but move nothing: sent/rank is 0, not the 2Ψ it read as "volume per rank"."""
    assert main(["estimate", "--params", "7e9", "--ranks", "1", "--stage", "0"]) == 0
    (row,) = _rows(capsys.readouterr().out)
    assert row[7:] == ["28.0GB", "0B"]  # 2 x 7e9 x 2 bytes; (1 - 1) / 1 of it


def test_estimate_rejects_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--params", "1e9", "--stage", "1", "--offload-param", "cpu"]) == 2
    assert "needs ZeRO stage 3" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["estimate", "--params", "lots"])
    assert "not a parameter count" in capsys.readouterr().err


def test_frozen_parameters_are_in_p_but_not_in_g_or_o() -> None:
    # The LoRA: 128,960 parameters of which 3,584 trainable, fp32, 2 ranks. P holds
    # every parameter (replicated at stages 0-2, sharded at 3); G and O only the trainable.
    psi, t = 128_960, 3_584
    rows = [formulas.model_state_bytes(psi, 2, s, "fp32", trainable=t) for s in range(4)]
    assert [(m.params, m.grads, m.optim) for m in rows] == [
        (4 * psi, 4 * t, 8 * t),
        (4 * psi, 4 * t, 8 * t / 2),
        (4 * psi, 4 * t / 2, 8 * t / 2),
        (4 * psi / 2, 4 * t / 2, 8 * t / 2),
    ]
    off = formulas.model_state_bytes(psi, 2, 2, "fp32", offload_optimizer="cpu", trainable=t)
    assert (off.host_grads, off.host_optim, off.params) == (4 * t / 2, 12 * t / 2, 4 * psi)
    # All trainable is the default; more trainable than Ψ is an error.
    assert formulas.model_state_bytes(psi, 2, 3, trainable=psi) == formulas.model_state_bytes(
        psi, 2, 3
    )
    with pytest.raises(ValueError, match="trainable"):
        formulas.model_state_bytes(10, 2, 1, trainable=11)
    # Frozen parameters have no gradient to reduce (nor, at stages 0-2, to gather back);
    # stage 3 still gathers them twice.
    assert [formulas.comm_elements_per_step(10, s, trainable=2) for s in range(4)] == [
        4,
        4,
        4,
        22,
    ]


def test_estimate_takes_the_trainable_share_or_count(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["estimate", "--params", "128960", "--ranks", "2", "--precision", "fp32"]
    assert main([*base, "--trainable", "3584"]) == 0
    out = capsys.readouterr().out
    assert "(3584 trainable)" in out.splitlines()[0]
    rows = _rows(out)
    # stage 2: P = 4 x 128,960 (the frozen base on every rank), G = 4 x 3,584 / 2,
    # O = 8 x 3,584 / 2; stage 3: P = 4 x 128,960 / 2.
    assert rows[2][1:4] == ["516KB", "7.2KB", "14.3KB"]
    assert rows[3][1:4] == ["258KB", "7.2KB", "14.3KB"]
    assert main([*base, "--trainable", "0.25"]) == 0
    share = _rows(capsys.readouterr().out)
    assert main([*base, "--trainable", "32240"]) == 0
    assert share == _rows(capsys.readouterr().out)
    assert main([*base, "--trainable", "1e6"]) == 2
    assert "more than --params" in capsys.readouterr().err
