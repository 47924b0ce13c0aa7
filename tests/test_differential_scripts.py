"""DeepSpeed 0.19.8 as the oracle for scripts the main matrix (tests/test_differential.py) does
not hold: a hand-written tied head read in the root's forward at stage 3 with persistence 0
(nothing registered: both engines must find it), client torch optimizers other than Adam(W)
(SGD with momentum, Adagrad: the pipeline tutorial's ``zero_allow_untested_optimizer``
pattern), ds_config optimizer types DeepSpeed takes from torch.optim, and a fixed budget of
generated models (tests/differential/generated.py). Same runner, same comparison, same
tolerances as the matrix (docs/differential.md)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.differential.cells import Cell
from tests.differential.compare import TOLERANCE, compare_cell, table, without_aliases
from tests.differential.conditioning import explained_by_rounding, fp32_error
from tests.differential.generated import cell_for, fixed_budget, spec_for
from tests.distributed import DEEPSPEED, run_ranks

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

SCRIPTS = [
    Cell(model="tiedhead", stage=3, persistence=0),
    Cell(model="tiedhead", stage=3, persistence=0, precision="bf16", accumulation=2),
    Cell(model="odd", stage=0, optimizer="client-SGD"),
    Cell(model="odd", stage=1, optimizer="client-Adagrad", precision="bf16"),
    Cell(model="odd", stage=2, optimizer="SGD", accumulation=2),
    Cell(model="odd", stage=3, persistence=0, optimizer="client-SGD"),
    # (not resumed: DeepSpeed 0.19.8's own stage-3 load of a torch Adagrad's state fails with
    # "loaded state dict contains a parameter group that doesn't match the size")
    Cell(model="odd", stage=3, optimizer="Adagrad", scheduler="decay"),
]
GENERATED = fixed_budget()
ILL_CONDITIONED = [cell_for(41), cell_for(54), cell_for(196)]
"""Soak seeds whose models amplify fp32 rounding past the tolerance (a LayerNorm over 2
features): compared against float32's own error on them, not the tolerance."""
CELLS = SCRIPTS + GENERATED + ILL_CONDITIONED


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, list[Any]]]:
    from tests.differential.runner import run_engine

    tmp = str(tmp_path_factory.mktemp("differential_scripts"))
    out = {}
    for engine in ("ours", "deepspeed"):
        preload = DEEPSPEED if engine == "deepspeed" else ()
        ranks = run_ranks(run_engine, 2, engine, CELLS, tmp, timeout=1000, preload=preload)
        out[engine] = {name: [r[name] for r in ranks] for name in ranks[0]}
    return out


@pytest.mark.parametrize("cell", SCRIPTS + GENERATED, ids=lambda c: c.name)
def test_script_matches_deepspeed(runs: dict[str, dict[str, list[Any]]], cell: Cell) -> None:
    ours, ds = runs["ours"][cell.name], runs["deepspeed"][cell.name]
    if cell.stage == 3 and "error" not in ours[0] and "error" not in ds[0]:
        ours, _ = without_aliases(ours, ds)
    d = compare_cell(cell.name, cell.precision, ours, ds)
    assert d.worst <= TOLERANCE[cell.precision], table([d])
    assert {"loss", "lr", "weights", "model16"} <= d.figures.keys()


def test_stage3_names_a_shared_module_once_where_deepspeed_does(
    runs: dict[str, dict[str, list[Any]]],
) -> None:
    """Found by the generator (seed 7: a residual block placed twice in the tree): DeepSpeed's
    stage-3 16-bit file names the shared block's parameters once; the engine writes torch's
    state_dict names, both paths, the second an alias of the first. Kept on purpose (a
    ``load_state_dict`` of the file into the module finds every key); the rest matches."""
    cell = next(c for c in GENERATED if c.model == "gen7")
    ours, ds = runs["ours"][cell.name], runs["deepspeed"][cell.name]
    _, dropped = without_aliases(ours, ds)
    assert "model16:blocks.1.up.weight" in dropped and "blocks.0.up.weight" in ds[0]["model16"]


@pytest.mark.parametrize("cell", ILL_CONDITIONED, ids=lambda c: c.name)
def test_ill_conditioned_generated_models_differ_only_as_fp32_rounding_does(
    runs: dict[str, dict[str, list[Any]]], cell: Cell
) -> None:
    """Found by the soak: seed 41 (stage 1, Adagrad; the engines' final ``blocks.2.up.bias``
    1.8e-5 apart), seed 54 (stage 2, AdamW, a head tied to the embedding; the third step's
    grad norm 4.2e-5 apart, every loss but one bitwise equal) and seed 196 (stage 0, a Linear
    placed four times; final weights 3.1e-5 apart). The three models end in a LayerNorm over 2
    features, whose gradient grows towards 1/sqrt(eps) as its two inputs meet: one process training
    the same model in float32 is itself 1.8e-5, 1.3e-5 and 1.0e-5 from float64 on the weights
    (6.7e-5, 1.3e-4, 6.2e-5 on the norms), and only reversing the order in which it adds two
    ranks' gradients moves the seed-54 norm by 7e-6. Neither engine is the odd one out (on 196
    DeepSpeed is 1.2e-5 and the engine 1.9e-5 from float64): what is checked is that the model
    is that ill-conditioned, and that on every figure over the tolerance each engine is within
    three times float32's own error of float64 (tests/differential/conditioning.py)."""
    assert spec_for(int(cell.model[3:])).dim == 2  # the generator still draws this model
    error = fp32_error(cell)
    assert max(error["weights"], error["grad_norm"]) >= TOLERANCE["fp32"], error
    ours, ds = runs["ours"][cell.name], runs["deepspeed"][cell.name]
    d = compare_cell(cell.name, cell.precision, ours, ds)
    assert {"loss", "lr", "weights", "model16"} <= d.figures.keys(), table([d])
    # Whether the two engines' roundings part past the tolerance depends on the machine: on
    # the same commit seed 54's engines were past it in CI's run and 6.5e-7 apart on another
    # 2-core VM, the model as ill-conditioned on both. Within the tolerance is what the budget
    # asks; past it, each engine must be as near float64 as float32 itself is.
    if d.worst > TOLERANCE["fp32"]:
        assert explained_by_rounding(d.figures, TOLERANCE["fp32"], cell, [ours[0], ds[0]]), table(
            [d]
        )
