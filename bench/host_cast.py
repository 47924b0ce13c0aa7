"""The offload paths' fp32 -> bf16 host cast (engine/host_cast.py) on one thread and on the
casting threads, paired in the same run, with the job's thread count at 1 as torchrun sets it.

    python -m bench.host_cast [--mb 100] [--rounds 7]

Prints the median time of each and the ratio (chunked / single); < 1 is faster. On a machine
with few idle cores the ratio tends to 1: the cast can only use cores nobody else is using.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import paired_ratio  # noqa: E402


def measure(mb: int, rounds: int) -> dict[str, float | int | None]:
    import torch

    from zeroscope.engine.host_cast import cast_workers, host_copy

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        src = torch.randn(mb * 2**20 // 4)
        dst = torch.empty(src.numel(), dtype=torch.bfloat16)
        workers = cast_workers()
        single: list[float] = []
        chunked: list[float] = []
        for _ in range(rounds):
            t = time.perf_counter()
            dst.copy_(src)
            single.append(time.perf_counter() - t)
            t = time.perf_counter()
            host_copy(dst, src, workers=workers)
            chunked.append(time.perf_counter() - t)
    finally:
        torch.set_num_threads(before)
    return {
        "fp32_MB": mb,
        "workers": workers,
        "single_s": statistics.median(single),
        "chunked_s": statistics.median(chunked),
        "chunked / single": paired_ratio(chunked, single),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=100, help="megabytes of fp32 to cast")
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args(argv)
    for key, value in measure(args.mb, args.rounds).items():
        print(f"{key}: {value:.4f}" if isinstance(value, float) else f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
