"""Tier 1 fuzzing of what users hand zeroscope: damaged trace files and mutated ds_configs.

A damaged trace (truncated, overwritten with random bytes, wrong format or schema version, a
directory, an empty file) given to ``zeroscope replay`` / ``summary`` / ``export`` ends in one
line ``zeroscope: error: ...`` and a non-zero exit, or is read from a salvaged copy with one line
``zeroscope: warning: ... is damaged ...`` saying what was lost, or - when the damage missed
everything the verb reads - a normal exit 0; never a traceback. A ds_config mutated by hypothesis (wrong types,
unknown keys, contradictory values) either loads or raises a one-line ConfigError; never another
exception type, never a hang. (The wire decoder's 10^5-message fuzz is tests/test_collector_fuzz.py.)
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fixtures import RunShape, synthetic_run, write_trace
from zeroscope.cli import main
from zeroscope.engine.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*argv: str) -> tuple[int, str, str]:
    """The verb in-process: an escaping exception fails the test with its traceback."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def assert_clean(code: int, err: str, path: Path) -> None:
    assert "Traceback" not in err
    if code != 0:
        assert err.startswith("zeroscope: error: ") and err.count("\n") == 1, (path, err)
    elif err:  # read from a salvaged copy: one line saying what was lost
        assert err.startswith("zeroscope: warning: ") and err.count("\n") == 1, (path, err)
        assert "is damaged" in err and str(path) in err


def damaged_traces(good: bytes, tmp: Path, n: int, seed: int = 5) -> list[Path]:
    """``n`` damaged copies of ``good``: truncations (at page edges and anywhere), random-byte
    overwrites of one region or scattered bytes, zeroed pages, and the header kept alone."""
    rng = random.Random(seed)
    out = []
    page = 4096
    for i in range(n):
        b = bytearray(good)
        kind = i % 5
        if kind == 0:  # truncated anywhere (a crash mid-copy, a full disk)
            del b[rng.randrange(1, len(b)) :]
        elif kind == 1:  # truncated at a page edge (what a torn copy looks like)
            del b[page * rng.randrange(1, max(2, len(b) // page)) :]
        elif kind == 2:  # a region overwritten with random bytes
            start = rng.randrange(len(b))
            size = rng.randint(1, 3 * page)
            b[start : start + size] = rng.randbytes(min(size, len(b) - start))
        elif kind == 3:  # scattered bit rot
            for _ in range(rng.randint(1, 50)):
                b[rng.randrange(len(b))] = rng.randrange(256)
        else:  # a whole page zeroed (never the header page: that is kind 0/2's job)
            p = rng.randrange(1, max(2, len(b) // page))
            b[p * page : (p + 1) * page] = bytes(min(page, len(b) - p * page))
        path = tmp / f"damaged-{i:03d}.zstrace"
        path.write_bytes(bytes(b))
        out.append(path)
    return out


@pytest.fixture(scope="module")
def good_trace(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("good") / "good.zstrace"
    write_trace(path, synthetic_run(RunShape(ranks=4, steps=12)))
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # everything in the main file
    return path.read_bytes()


def test_damaged_traces_end_in_one_line_errors(good_trace: bytes, tmp_path: Path) -> None:
    n = 60
    failures: dict[str, int] = {}
    for path in damaged_traces(good_trace, tmp_path, n):
        for verb in (["replay", "--headless"], ["summary"], ["export"]):
            code, _, err = run_cli(*verb, str(path))
            assert_clean(code, err, path)
            if code or err:
                failures[verb[0]] = failures.get(verb[0], 0) + 1
    # The damage is real: most damaged files are refused, or salvaged saying so, by every verb.
    assert min(failures.values()) >= n // 3, failures
    print(f"{n} damaged traces x 3 verbs: refused or salvaged {failures}")


def test_odd_trace_paths_end_in_one_line_errors(good_trace: bytes, tmp_path: Path) -> None:
    empty = tmp_path / "empty.zstrace"
    empty.write_bytes(b"")
    header = tmp_path / "header.zstrace"
    header.write_bytes(good_trace[:100])
    folder = tmp_path / "folder.zstrace"
    folder.mkdir()
    version = tmp_path / "version.zstrace"
    version.write_bytes(good_trace)
    with sqlite3.connect(version) as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    fmt = tmp_path / "format.zstrace"
    fmt.write_bytes(good_trace)
    with sqlite3.connect(fmt) as conn:
        conn.execute("DELETE FROM meta WHERE key = 'format'")
    payload = tmp_path / "payload.zstrace"
    payload.write_bytes(good_trace)
    with sqlite3.connect(payload) as conn:  # a row whose msgpack is garbage
        conn.execute("UPDATE messages SET payload = x'c1c1' WHERE seq = 10")
    for path, words in [
        (empty, "not a zeroscope trace"),
        (header, str(header)),
        (folder, "is a directory, not a trace file"),
        (version, "schema_version 99"),
        (fmt, "not a zeroscope trace"),
        (payload, "corrupt row"),
    ]:
        for verb in (["replay", "--headless"], ["summary"], ["export"]):
            code, _, err = run_cli(*verb, str(path))
            assert code != 0 and words in err, (verb, path, err)
            assert_clean(code, err, path)
    # advise takes a trace or a ds_config: what is neither is named as such, not read as a
    # ds_config ("a ds_config needs --world-size N" on a folder or an empty .zstrace).
    for path, words in [
        (folder, "is a directory, not a trace or a ds_config"),
        (empty, "not a zeroscope trace"),
    ]:
        code, _, err = run_cli("advise", str(path))
        assert code != 0 and words in err, (path, err)
        assert_clean(code, err, path)


# -- ds_config -------------------------------------------------------------------------------

VALID_CONFIG: dict[str, Any] = json.loads((ROOT / "examples" / "ds_config_stage2.json").read_text())

ODD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["auto", "none", "cpu", "nvme", "AdamW", "1e-3", "", "true"]),
    st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.text(max_size=6), st.integers(), max_size=2),
)


def paths_of(tree: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.append((*prefix, k))
            out += paths_of(v, (*prefix, k))
    return out


KEYS = [
    *paths_of(VALID_CONFIG),
    ("zero_optimization", "stage"),
    ("zero_optimization", "offload_optimizer"),
    ("zero_optimization", "offload_param", "device"),
    ("zero_optimization", "stage3_prefetch_bucket_size"),
    ("bf16", "enabled"),
    ("train_batch_size",),
    ("gradient_accumulation_steps",),
    ("scheduler", "type"),
    ("optimizer", "type"),
]


@st.composite
def mutated_configs(draw: st.DrawFn) -> dict[str, Any]:
    cfg = json.loads(json.dumps(VALID_CONFIG))
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(KEYS))
        op = draw(st.sampled_from(["set", "delete", "unknown"]))
        node = cfg
        for key in path[:-1]:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        if op == "set":
            node[path[-1]] = draw(ODD_VALUES)
        elif op == "delete":
            node.pop(path[-1], None)
        else:
            node[path[-1] + draw(st.sampled_from(["_", "s", "X"]))] = draw(ODD_VALUES)
    return cfg


@settings(
    max_examples=300,
    deadline=2000,  # a hang fails the example
    suppress_health_check=[HealthCheck.too_slow],
)
@given(mutated_configs(), st.sampled_from([1, 2, 3, 8]))
def test_mutated_ds_configs_load_or_raise_one_line_config_errors(
    cfg: dict[str, Any], world: int
) -> None:
    try:
        load_config(cfg, dp_world_size=world)
    except ConfigError as exc:
        text = str(exc)
        assert text and "\n" not in text


@settings(max_examples=100, deadline=2000)
@given(st.text(max_size=200))
def test_ds_config_text_that_is_not_json_is_a_config_error(text: str) -> None:
    try:
        load_config("{" + text, dp_world_size=1)
    except ConfigError as exc:
        assert "\n" not in str(exc)
