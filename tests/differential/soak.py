"""The generated differential suite's long soak: many seeds' models (tests/differential/
generated.py) trained on both engines, compared as the suite compares, every failing seed
printed with the model it built.

    python -m tests.differential.soak [--first 0] [--count 300] [--chunk 25]

Seeds run in chunks of ``--chunk`` cells per 2-rank launch (one launch per engine per chunk:
DeepSpeed's start-up is paid once per chunk). Exit status 1 when any seed differs beyond the
suite's tolerance or fails on one engine only.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from .compare import TOLERANCE, compare_cell, table
from .generated import cell_for, spec_for


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--chunk", type=int, default=25)
    args = parser.parse_args(argv)
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch-extensions"))
    from tests.distributed import run_ranks

    from .runner import run_engine

    seeds = list(range(args.first, args.first + args.count))
    failing: list[int] = []
    with tempfile.TemporaryDirectory() as tmp:
        for at in range(0, len(seeds), args.chunk):
            cells = [cell_for(n) for n in seeds[at : at + args.chunk]]
            runs = {}
            for engine in ("ours", "deepspeed"):
                ranks = run_ranks(run_engine, 2, engine, cells, tmp, timeout=3600)
                runs[engine] = {name: [r[name] for r in ranks] for name in ranks[0]}
            for cell in cells:
                d = compare_cell(
                    cell.name, cell.precision, runs["ours"][cell.name], runs["deepspeed"][cell.name]
                )
                if d.worst > TOLERANCE[cell.precision]:
                    n = int(cell.model[3:])
                    failing.append(n)
                    print(f"FAIL seed {n}: {spec_for(n).describe()}\n{table([d])}", flush=True)
            print(f"{at + len(cells)}/{len(seeds)} seeds, {len(failing)} failing", flush=True)
    print(f"failing seeds: {failing}" if failing else f"all {len(seeds)} seeds match DeepSpeed")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
