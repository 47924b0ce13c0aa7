"""Rule 2b against real DeepSpeed: ZeRO-3's reduce bucket, held for the whole run, sized to the
model's gradients issues the same reduce-scatters and holds less.

DeepSpeed 0.19.8's ZeRO-3 allocates ``reduce_bucket_size`` elements per gradient dtype with its
optimizer (default 5e8: 1 GB in bf16, on a model of any size). One unmodified sweep script
(tests/jobs/deepspeed_train.py) trains the same model twice under ``zeroscope run``: with a
bucket far larger than the model's gradients, then with the size the advisor asks for. Oracles:
DeepSpeed's own collectives of both runs (equal, op by op and byte by byte, every step) and the
G each run measured (the drop is the saving the advice priced).
"""

from __future__ import annotations

import pytest

from tests.attach_support import JOBS, job_env, read_trace, run_zeroscope, segments, write_configs
from tests.jobs.deepspeed_train import build_model
from zeroscope.agent.schema import Hello, StepReport
from zeroscope.state import ClusterState
from zeroscope.state.advice import advise

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 3
N = 2
TRAINABLE = sum(p.numel() for p in build_model().parameters())


def _config(bucket: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 4,
        "zero_optimization": {"stage": 3, "reduce_bucket_size": bucket},
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("held-bucket")
    paths = write_configs(tmp, {"big": _config(50 * TRAINABLE), "fit": _config(TRAINABLE)})
    args = ["--configs", ",".join(paths), "--steps", str(STEPS), "--out", str(tmp / "zs")]
    run_zeroscope(JOBS / "deepspeed_train.py", args, job_env(), tmp / "t.zstrace", 800)
    trace = read_trace(tmp / "t.zstrace")
    return {
        rank: {
            "hellos": dict(zip(("big", "fit"), trace[rank].hellos, strict=True)),
            "steps": dict(zip(("big", "fit"), segments(trace[rank].steps, [STEPS] * 2))),
        }
        for rank in range(N)
    }


def _state(hellos: list[Hello], steps: list[StepReport]) -> ClusterState:
    state = ClusterState()
    for m in [*hellos, *steps]:
        state.ingest(m)
    state.flush()
    return state


def test_the_advice_asks_for_the_models_size_and_prices_the_measured_drop(runs: dict) -> None:
    hellos = [runs[r]["hellos"]["big"] for r in range(N)]
    steps = [s for r in range(N) for s in runs[r]["steps"]["big"]]
    found = [a for a in advise(_state(hellos, steps)).advice if "reduce bucket holds" in a.title]
    assert len(found) == 1, [a.title for a in advise(_state(hellos, steps)).advice]
    (advice,) = found
    assert advice.change.ds_config == {"zero_optimization.reduce_bucket_size": TRAINABLE}
    for rank in range(N):
        big = runs[rank]["steps"]["big"][-1].memory.grads
        fit = runs[rank]["steps"]["fit"][-1].memory.grads
        assert advice.saves_bytes == pytest.approx(big - fit)  # the measured drop
    # Nothing to say once the bucket fits.
    hellos = [runs[r]["hellos"]["fit"] for r in range(N)]
    steps = [s for r in range(N) for s in runs[r]["steps"]["fit"]]
    assert not [a for a in advise(_state(hellos, steps)).advice if "reduce bucket" in a.title]


def test_the_collectives_stay_the_same(runs: dict) -> None:
    for rank in range(N):
        for big, fit in zip(runs[rank]["steps"]["big"], runs[rank]["steps"]["fit"], strict=True):
            assert [(c.op, c.nbytes) for c in big.collectives] == [
                (c.op, c.nbytes) for c in fit.collectives
            ]
