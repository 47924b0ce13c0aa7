"""ZeRO stages 0, 1 and 2 on 2 and 4 gloo ranks against one-process torch training.

Each group of cases runs in ONE set of rank processes (spawning is the expensive part); every
case trains tests/models.py's TinyGPT (tied weights, a block called twice, odd sizes) from the
same seed and is compared with one process training the same global batch with
torch.optim.AdamW (or Adam) and torch.nn.utils.clip_grad_norm_:

- loss trajectory and final weights: tight in fp32 (atol 5e-6 on losses, 1e-4 on weights);
  bf16 within 0.03 and fp16 within 0.015 of the loss (16-bit forward/backward vs fp32);
- the reported global gradient norm equals clip_grad_norm_'s on the unsharded model;
- fp16 with inf injected into ONE gradient element on rank 0 at chosen steps: the (skipped,
  scale) sequence equals an independent reference of DeepSpeed's algorithm
  (tests/test_engine_units.py), every rank skips the same steps (overflow agreed by all-reduce
  MAX: at stage 2 only one rank's shard holds the inf), masters and Adam state are bitwise
  unchanged on skipped steps, and the run stops with a clear error at the minimum scale;
- per-rank P/G/O bytes equal the ZeRO formulas with padding, and each step's collectives are
  exactly the expected ones: 2 Psi bytes of traffic for stages 0, 1, 2 (an all-reduce counts
  twice: reduce-scatter + all-gather), (gas + 1) Psi for stage 2 with accumulation.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from tests.distributed import run_ranks
from tests.models import TinyGPT, batches, param_count
from tests.test_engine_units import reference_scale_trace
from zeroscope.engine.zero.partition import padded_size

# eps 1e-5, not 1e-8: the attention key bias has an exactly-zero true gradient, so Adam turns
# rounding noise (~1e-9) into O(lr) updates whose sign depends on summation order; even two
# one-process runs that chunk the batch differently then differ by 2e-3 there at eps 1e-8.
LR, BETAS, EPS, WD = 1e-2, (0.9, 0.99), 1e-5, 0.01


@dataclass
class Case:
    name: str
    stage: int
    gas: int = 1
    steps: int = 20
    mb: int = 2
    precision: str = "fp32"
    zero: dict[str, Any] = field(default_factory=dict)
    fp16: dict[str, Any] = field(default_factory=dict)
    clip: float | None = None
    """None: key absent (DeepSpeed's default 1.0)."""
    optimizer: str = "AdamW"
    adam_w_mode: bool = True
    inject: tuple[int, ...] = ()
    """fp16: steps at which rank 0 writes inf into one gradient element."""
    single_bucket: bool = True

    def ds_config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            "train_micro_batch_size_per_gpu": self.mb,
            "gradient_accumulation_steps": self.gas,
            "steps_per_print": 0,
            "zero_optimization": {"stage": self.stage, **self.zero},
            "optimizer": {
                "type": self.optimizer,
                "params": {
                    "lr": LR,
                    "betas": list(BETAS),
                    "eps": EPS,
                    "weight_decay": WD,
                    "adam_w_mode": self.adam_w_mode,
                },
            },
        }
        if self.clip is not None:
            cfg["gradient_clipping"] = self.clip
        if self.precision == "bf16":
            cfg["bf16"] = {"enabled": True}
        if self.precision == "fp16":
            cfg["fp16"] = {"enabled": True, **self.fp16}
        return cfg


def _poison_hook(case: Case, rank: int, clock: dict[str, int]) -> Any:
    def hook(grad: torch.Tensor) -> torch.Tensor:
        if rank == 0 and clock["step"] in case.inject:
            grad = grad.clone()
            grad.view(-1)[5] = float("inf")
        return grad

    return hook


def train_cases(rank: int, world: int, cases: list[Case]) -> list[dict[str, Any]]:
    """Rank body: train every case, return what the engine did and reported."""
    from tests.recorder import RecordingTelemetry
    from zeroscope.agent.api import set_telemetry
    from zeroscope.engine.api import initialize
    from zeroscope.engine.precision import LossScaleAtMinimum

    results = []
    for case in cases:
        rec = RecordingTelemetry()
        set_telemetry(rec)
        torch.manual_seed(0)
        model = TinyGPT()
        engine, _, _, _ = initialize(model=model, config=case.ds_config())
        clock = {"step": 0}
        if case.inject:
            model.blocks[0].fc.weight.register_hook(_poison_hook(case, rank, clock))
        kept: list[bool] = []
        error = None
        try:
            for step, (x, y) in enumerate(batches(case.steps, case.mb * case.gas * world, seed=1)):
                clock["step"] = step
                masters = [
                    (s.master.clone(), s.state.exp_avg.clone(), s.state.exp_avg_sq.clone())
                    for s in engine.strategy.shards
                ]
                weights = [p.detach().clone() for p in model.parameters()]
                for k in range(case.gas):
                    lo = (rank * case.gas + k) * case.mb
                    loss = engine(x[lo : lo + case.mb], y[lo : lo + case.mb])
                    engine.backward(loss)
                    engine.step()
                if rec.steps[-1].figures["skipped"]:
                    same = all(
                        torch.equal(m, s.master)
                        and torch.equal(a, s.state.exp_avg)
                        and torch.equal(v, s.state.exp_avg_sq)
                        for (m, a, v), s in zip(masters, engine.strategy.shards)
                    )
                    same &= all(torch.equal(w, p) for w, p in zip(weights, model.parameters()))
                    kept.append(same)
        except LossScaleAtMinimum as exc:
            error = str(exc)
        results.append(
            {
                "name": case.name,
                "losses": [float(s.figures["loss"]) for s in rec.steps],
                "norms": [
                    None if s.figures["grad_norm"] is None else float(s.figures["grad_norm"])
                    for s in rec.steps
                ],
                "scales": [(s.figures["skipped"], s.figures["loss_scale"]) for s in rec.steps],
                "memory": [(s.memory.params, s.memory.grads, s.memory.optim) for s in rec.steps],
                "collectives": [
                    [(c.op, c.nbytes, c.label, c.group_size) for c in s.collectives]
                    for s in rec.steps
                ],
                "padded_total": rec.hellos[0]["params"].padded_total,
                "grad_timing": [
                    [
                        (c.issued_in_backward, c.waited_in_backward)
                        for c in s.collectives
                        if c.label == "grads"
                    ]
                    for s in rec.steps
                ],
                "init": [(c.op, c.nbytes, c.label, c.group_size) for c in rec.init_collectives],
                "events": [kind for kind, _, _ in rec.events],
                "scale_changes": [v for kind, _, v in rec.events if kind == "scale_change"],
                "kept": kept,
                "error": error,
                # numpy, not tensors: torch shares tensors between processes through file
                # descriptors that vanish with the rank process
                "weights": {
                    n: p.detach().float().numpy().copy() for n, p in model.named_parameters()
                },
            }
        )
    set_telemetry(None)
    return results


_REFERENCES: dict[tuple[str, int], dict[str, Any]] = {}


def reference(case: Case, world: int) -> dict[str, Any]:
    """One process, fp32, the whole global batch, torch.optim + clip_grad_norm_ (cached)."""
    key = (case.name, world)
    if key not in _REFERENCES:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # tiny ops: threads only fight over the 2 cores
        try:
            _REFERENCES[key] = _reference(case, world)
        finally:
            torch.set_num_threads(threads)
    return _REFERENCES[key]


def _reference(case: Case, world: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model = TinyGPT()
    params = list(model.parameters())
    decoupled = case.optimizer == "AdamW" or case.adam_w_mode
    cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    opt = cls(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    clip = 1.0 if case.clip is None else case.clip
    losses, norms = [], []
    chunks = case.gas * world
    for step, (x, y) in enumerate(batches(case.steps, case.mb * chunks, seed=1)):
        opt.zero_grad()
        total = 0.0
        for c in range(chunks):
            lo = c * case.mb
            loss = model(x[lo : lo + case.mb], y[lo : lo + case.mb])
            (loss / chunks).backward()
            total += loss.item() / chunks
        losses.append(total)
        if step in case.inject:
            norms.append(None)
            continue  # the engine skips this step
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, clip)))
        opt.step()
    return {"losses": losses, "norms": norms, "weights": dict(model.named_parameters())}


def run_group(cases: list[Case], world: int) -> dict[str, list[dict[str, Any]]]:
    per_rank = run_ranks(train_cases, world, cases, timeout=240)
    return {c.name: [per_rank[r][i] for r in range(world)] for i, c in enumerate(cases)}


FP32_CASES = [
    Case("s0", stage=0, gas=2),
    Case(
        "s1-overlap-buckets-clip",
        1,
        gas=2,
        zero={"overlap_comm": True, "reduce_bucket_size": 1500},
        clip=0.05,
        single_bucket=False,
    ),
    Case(
        "s2-overlap-buckets-scattered",
        2,
        gas=2,
        zero={"overlap_comm": True, "reduce_bucket_size": 1500, "contiguous_gradients": False},
        single_bucket=False,
    ),
    Case(
        "s0-overlap-scattered-adam",
        0,
        steps=6,
        zero={"overlap_comm": True, "contiguous_gradients": False, "reduce_bucket_size": 1500},
        optimizer="Adam",
        adam_w_mode=False,
        single_bucket=False,
    ),
    Case("s1", 1, steps=4),
    Case("s2-gas2", 2, gas=2, steps=4),
    Case("s2-allreduce", 2, steps=6, zero={"reduce_scatter": False}),
]
MIXED_CASES = [
    Case("bf16-s0", 0, precision="bf16"),
    Case("bf16-s1", 1, gas=2, precision="bf16"),
    Case("bf16-s2-overlap", 2, precision="bf16", zero={"overlap_comm": True}),
    Case(
        "fp16-s2-inject",
        2,
        gas=2,
        precision="fp16",
        fp16={"initial_scale_power": 8, "loss_scale_window": 3},
        inject=(2, 3, 4, 9, 15),
    ),
    Case(
        "fp16-s0-consecutive",
        0,
        precision="fp16",
        fp16={
            "initial_scale_power": 8,
            "loss_scale_window": 3,
            "consecutive_hysteresis": True,
            "hysteresis": 3,
        },
        inject=(1, 2, 6, 7, 8, 9, 14),
    ),
    Case("fp16-s1-static", 1, steps=8, precision="fp16", fp16={"loss_scale": 128}, inject=(3,)),
    Case(
        "fp16-s1-minimum",
        1,
        steps=5,
        precision="fp16",
        fp16={"initial_scale_power": 1, "hysteresis": 1},
        inject=(0, 1, 2, 3, 4),
    ),
]
WORLD4_CASES = [
    Case("w4-s1", 1, steps=5),
    Case("w4-s2-overlap", 2, gas=2, steps=5, zero={"overlap_comm": True}),
]
TOLERANCE = {"fp32": 5e-6, "bf16": 3e-2, "fp16": 1.5e-2}
"""Absolute loss tolerance; measured worst cases: fp32 7e-7, bf16 1.2e-2, fp16 5.7e-3."""


@pytest.fixture(scope="module")
def fp32_runs() -> dict[str, list[dict[str, Any]]]:
    return run_group(FP32_CASES, 2)


@pytest.fixture(scope="module")
def mixed_runs() -> dict[str, list[dict[str, Any]]]:
    return run_group(MIXED_CASES, 2)


@pytest.fixture(scope="module")
def world4_runs() -> dict[str, list[dict[str, Any]]]:
    return run_group(WORLD4_CASES, 4)


def check_against_reference(case: Case, ranks: list[dict[str, Any]], world: int) -> None:
    ref = reference(case, world)
    tol = TOLERANCE[case.precision]
    steps = len(ranks[0]["losses"])
    engine_losses = [sum(r["losses"][i] for r in ranks) / world for i in range(steps)]
    assert engine_losses == pytest.approx(ref["losses"][:steps], abs=tol, rel=0), case.name
    # every rank reports the same global norm, equal to clip_grad_norm_'s
    for r in ranks:
        assert r["norms"] == ranks[0]["norms"]
    norm_tol = 1e-5 if case.precision == "fp32" else 0.03  # measured: 2.3e-7, 1.1e-2
    for got, want in zip(ranks[0]["norms"], ref["norms"]):
        assert (got is None) == (want is None), case.name
        if got is not None:
            assert got == pytest.approx(want, rel=norm_tol), case.name
    if case.precision == "fp32":
        for name, w in ranks[0]["weights"].items():
            torch.testing.assert_close(
                torch.from_numpy(w),
                ref["weights"][name].detach(),
                atol=1e-4,
                rtol=0,
                msg=f"{case.name} {name}",
            )
        for r in ranks[1:]:  # every rank holds the same full model at stages 0-2
            for name, w in r["weights"].items():
                assert (w == ranks[0]["weights"][name]).all(), f"{case.name} {name}"


@pytest.mark.parametrize("case", FP32_CASES, ids=lambda c: c.name)
def test_fp32_stages_match_one_process_adamw(case: Case, fp32_runs: dict) -> None:
    check_against_reference(case, fp32_runs[case.name], 2)


@pytest.mark.parametrize(
    "case", [c for c in MIXED_CASES if "minimum" not in c.name], ids=lambda c: c.name
)
def test_mixed_precision_stages_match_one_process_adamw(case: Case, mixed_runs: dict) -> None:
    check_against_reference(case, mixed_runs[case.name], 2)


@pytest.mark.parametrize("case", WORLD4_CASES, ids=lambda c: c.name)
def test_four_ranks_match_one_process_adamw(case: Case, world4_runs: dict) -> None:
    check_against_reference(case, world4_runs[case.name], 4)


def test_clipping_was_active_and_matched() -> None:
    """The clip=0.05 case really clipped (the norms exceed it), so matching the reference's
    weights above proves clip_grad_norm_ semantics, not a no-op."""
    case = next(c for c in FP32_CASES if c.clip)
    ref = reference(case, 2)
    assert all(n > 0.05 for n in ref["norms"])


@pytest.mark.parametrize("case", [c for c in MIXED_CASES if c.inject], ids=lambda c: c.name)
def test_fp16_overflow_skips_follow_deepspeeds_scaler(case: Case, mixed_runs: dict) -> None:
    ranks = mixed_runs[case.name]
    flags = [i in case.inject for i in range(case.steps)]
    if case.fp16.get("loss_scale"):
        want = [(f, float(case.fp16["loss_scale"])) for f in flags]
        stop = None
    else:
        ref_args = {
            "init": 2.0 ** case.fp16.get("initial_scale_power", 16),
            "window": case.fp16.get("loss_scale_window", 1000),
            "hysteresis": case.fp16.get("hysteresis", 2),
            "consecutive": case.fp16.get("consecutive_hysteresis", False),
        }
        want, stop = reference_scale_trace(flags, **ref_args)
    for r in ranks:
        reported = r["scales"]
        if stop is not None:  # the stopping step raises before it reports
            assert reported == want[:stop], case.name
            assert r["error"] and "already at its minimum" in r["error"]
            assert r["events"][-1] == "scale_at_minimum"
        else:
            assert reported == want, case.name
            assert r["error"] is None
        assert r["kept"] and all(r["kept"]), f"{case.name}: a skipped step changed weights"
        # scales in force at each step, plus the one after the last update
        if stop is not None or case.fp16.get("loss_scale"):
            scales = [s for _, s in want]
        else:
            scales = [s for _, s in reference_scale_trace([*flags, False], **ref_args)[0]]
        changes = [b for a, b in itertools.pairwise(scales) if b != a]
        assert r["scale_changes"] == changes, case.name
        assert r["events"].count("overflow") == sum(s for s, _ in want[: len(reported)]) + (
            stop is not None
        )


def expected_memory(stage: int, precision: str, world: int, psi: int) -> tuple[int, int, int]:
    """ZeRO paper's per-rank model-state bytes with padding: P, G in the training dtype; O is
    the fp32 master (none in fp32 training: the params are the master) + Adam m, v."""
    b = 4 if precision == "fp32" else 2
    k = 8 if precision == "fp32" else 12
    shards = 1 if stage == 0 else world
    padded = padded_size(psi, shards)
    shard = padded // shards
    return b * padded, b * (padded if stage < 2 else shard), k * shard


def expected_collectives(case: Case, world: int, psi: int, skipped: bool) -> list[tuple]:
    b = 4 if case.precision == "fp32" else 2
    n = 1 if case.stage == 0 else world
    full = padded_size(psi, n) * b
    if case.stage == 0:
        seq = [("all_reduce", full, "grads", world)]
    elif case.stage == 1:
        seq = [("reduce_scatter", full, "grads", world)]
    else:
        seq = [("reduce_scatter", full, "grads", world)] * case.gas
    if case.precision == "fp16" and case.stage > 0:
        seq.append(("all_reduce", 4, "overflow", world))
    if not skipped and case.stage > 0:
        seq += [("all_reduce", 4, "grad_norm", world), ("all_gather", full, "params", world)]
    return seq


def traffic(step: list[tuple]) -> int:
    """Bytes moved per rank in ring terms: all-reduce = reduce-scatter + all-gather."""
    return sum(
        nb * (2 if op == "all_reduce" else 1)
        for op, nb, label, _ in step
        if label in ("grads", "params")
    )


def check_bytes(case: Case, ranks: list[dict[str, Any]], world: int) -> None:
    psi = param_count(TinyGPT())
    b = 4 if case.precision == "fp32" else 2
    n = 1 if case.stage == 0 else world
    for r in ranks:
        assert r["padded_total"] == padded_size(psi, n)
        # every rank starts from rank 0's weights: one broadcast of the flat parameters
        assert r["init"] == [("broadcast", padded_size(psi, n) * b, "init", world)]
        for mem in r["memory"]:
            assert mem == expected_memory(case.stage, case.precision, world, psi), case.name
        for step, (skipped, _) in zip(r["collectives"], r["scales"]):
            assert step == expected_collectives(case, world, psi, skipped), case.name
            if not skipped:
                per_grad_pass = 1 if case.stage < 2 else case.gas
                assert traffic(step) == (per_grad_pass + 1) * padded_size(psi, n) * b


@pytest.mark.parametrize(
    "case",
    [c for c in FP32_CASES if c.single_bucket and "allreduce" not in c.name],
    ids=lambda c: c.name,
)
def test_bytes_and_traffic_match_formulas(case: Case, fp32_runs: dict) -> None:
    check_bytes(case, fp32_runs[case.name], 2)


def test_bytes_fp16_and_four_ranks(mixed_runs: dict, world4_runs: dict) -> None:
    fp16 = next(c for c in MIXED_CASES if c.name == "fp16-s2-inject")
    check_bytes(fp16, mixed_runs[fp16.name], 2)
    for case in WORLD4_CASES:
        check_bytes(case, world4_runs[case.name], 4)


def test_bucketing_splits_reductions(fp32_runs: dict) -> None:
    """reduce_bucket_size=1500 elements: several grad collectives per reduction, and their
    full sizes add up to the padded flat buffers (each bucket pads to the rank count)."""
    r = fp32_runs["s1-overlap-buckets-clip"][0]
    step = r["collectives"][0]
    grads = [nb for op, nb, label, _ in step if label == "grads"]
    params = [nb for op, nb, label, _ in step if label == "params"]
    assert len(grads) > 2 and grads == params
    assert sum(grads) == 4 * r["padded_total"] and r["padded_total"] >= param_count(TinyGPT())
    assert math.isclose(sum(grads) / 4, param_count(TinyGPT()), rel_tol=0.01)


@pytest.mark.parametrize(
    ("name", "issued", "waited"),
    [
        ("s0", False, False),  # DeepSpeed's default: reduce after backward, at the boundary
        ("s1", False, False),
        ("s2-gas2", True, True),  # stage 2 must free full gradients during backward
        ("s1-overlap-buckets-clip", True, False),  # overlap_comm: launched by hooks, waited later
        # stage 2 + overlap: one reduction in flight, so each bucket's is waited for when the
        # next one launches (in backward, freeing its full buffer); each micro-batch's last later
        ("s2-overlap-buckets-scattered", True, None),
    ],
)
def test_overlap_comm_launches_during_backward_and_waits_later(
    name: str, issued: bool, waited: bool | None, fp32_runs: dict
) -> None:
    for r in fp32_runs[name]:
        if waited is None:
            gas = next(c.gas for c in FP32_CASES if c.name == name)
            for step in r["grad_timing"]:
                n = len(step) // gas
                for micro in (step[i : i + n] for i in range(0, len(step), n)):
                    assert micro[-1] == (issued, False), name
                    assert set(micro[:-1]) == {(issued, True)}, name
            continue
        timing = {t for step in r["grad_timing"] for t in step}
        assert timing == {(issued, waited)}, name
