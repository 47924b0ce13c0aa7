"""Shared fixtures and markers: GPU tests skip without CUDA; every other test runs with CUDA
hidden (the CPU tiers), so a machine with a GPU runs them as a CPU-only one does."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# DeepSpeed JIT-builds its CPU ops (cpu_adam, shm_comm) on first use, for minutes; keep them in the
# venv (as the Makefile does) so a second run, and every rank of a run, reuses them.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch-extensions"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak",
        action="store_true",
        help="also run the tests marked soak (minutes each; `make test-soak` passes it)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The soak tier (8 ranks on a 2-core runner, two engines per script) would take `make test`
    # past its CI budget: its tests are deselected, listed as such, unless --soak is given.
    if not config.getoption("--soak"):
        soak = [item for item in items if item.get_closest_marker("soak") is not None]
        if soak:
            config.hook.pytest_deselected(items=soak)
            items[:] = [item for item in items if item.get_closest_marker("soak") is None]
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        # The marker itself, not ``"gpu" in item.keywords``: keywords also hold the names of the
        # folders above the test, so a checkout in a folder named "gpu" skipped every test.
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _cpu_tier(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hide CUDA from a test not marked ``gpu``: ``CUDA_VISIBLE_DEVICES=""`` for every process it
    starts (``zeroscope run``, torchrun, scripts; tests/distributed.py sets it in its ranks too)
    and ``torch.cuda.is_available()`` False in this process (whose CUDA driver may be initialized
    already, so the variable alone no longer hides it). The engine picks CUDA whenever it is
    available: without this a machine with a GPU would run the CPU tiers on NCCL. A GPU test
    opts in with the marker."""
    if request.node.get_closest_marker("gpu") is not None:
        return
    import torch

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture(autouse=True, scope="session")
def _private_zeroscope_home_for_the_session(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[None]:
    """The same for module- and session-scoped fixtures, which run before any function's
    monkeypatch: their ``zeroscope run`` jobs had left ~110 discovery records in the user's
    ~/.cache/zeroscope/jobs (``zeroscope jobs --all`` listed pytest's temporary traces)."""
    before = os.environ.get("ZEROSCOPE_HOME")
    os.environ["ZEROSCOPE_HOME"] = str(tmp_path_factory.getbasetemp() / "zeroscope-home")
    yield
    if before is None:
        os.environ.pop("ZEROSCOPE_HOME", None)
    else:
        os.environ["ZEROSCOPE_HOME"] = before


@pytest.fixture(autouse=True)
def _private_zeroscope_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Discovery records (zeroscope run/serve) go to a temporary folder, never the user's own
    ~/.cache or $XDG_RUNTIME_DIR; subprocesses inherit it. Tests may set their own."""
    monkeypatch.setenv("ZEROSCOPE_HOME", str(tmp_path_factory.getbasetemp() / "zeroscope-home"))


@pytest.fixture(params=["C seam", "Python seam"])
def seam(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which per-collective seam the agents made in the test use (agent/host_seam.py): the C
    one (agent/_seam.c, built by ``pip install -e .`` on Linux) or its Python twin."""
    from zeroscope.agent import host_seam

    if request.param == "Python seam":
        monkeypatch.setattr(host_seam, "NATIVE", None)
    elif host_seam.NATIVE is None:
        if not sys.platform.startswith("linux"):
            pytest.skip("the C seam is built on Linux only")
        pytest.fail("agent/_seam.c was not built: run `pip install -e .` (needs gcc)")
    return str(request.param)


@pytest.fixture
def agent(seam: str) -> Iterator[Any]:
    """A live agent whose messages go to a ``Sink`` (tests/test_agent_timeline.py), its sampler
    asleep: (agent, sink), once per seam; reading ``sink.reports()`` first sends what is
    ready."""
    from tests.test_agent_timeline import Sink
    from zeroscope.agent.live import LiveTelemetry

    sink = Sink()
    tel = LiveTelemetry(sink, sample_interval=60.0)  # type: ignore[arg-type]
    sink.drain = tel.drain
    yield tel, sink
    tel.close()
