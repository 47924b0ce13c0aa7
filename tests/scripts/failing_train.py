"""A job whose rank 0 dies of a configuration error right after the process group is up,
before any rank reports to zeroscope, while rank 1 waits in a collective (it says so first, on
stderr). The peer's failure usually reaches rank 1 as gloo's "connection closed" (its own
traceback) before torchrun stops it, but not always: torchrun may see rank 0 gone first. The
end-to-end tests of how ``zeroscope run`` reports a failed job use it."""

from __future__ import annotations

import argparse
import sys

import torch
import torch.distributed as dist

MESSAGE = (
    "unknown key 'reduce_bucket_sise' in zero_optimization (did you mean 'reduce_bucket_size'?)"
)

WAITING = "rank 1 waits in a collective for rank 0"


class ConfigError(ValueError):
    """What a config check raises (a stand-in for the engine's)."""


def exit_of_rank_0(log: str) -> tuple[int, str]:
    """Rank 0's exit code as torchrun logged it, and what zeroscope adds to its error line.

    It raises (exit code 1), but torch's gloo teardown can then abort it at the interpreter's
    exit (its process group is still up): "terminate called without an active exception",
    SIGABRT. Rare (none in 60 runs here; once in a clean-clone run under load) and torch's,
    not the job's or zeroscope's; zeroscope must then say the error and the signal."""
    if "failed (exitcode: -6) local_rank: 0" in log:
        return 134, " (then killed by SIGABRT)"
    assert "failed (exitcode: 1) local_rank: 0" in log, log
    return 1, ""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--exit-code", type=int, default=0, help="sys.exit(N) instead of raising")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        # Printed before the collective rank 0 needs to reach its error: in the job's output
        # whatever happens next (torchrun may stop rank 1 before the peer's loss reaches it).
        print(WAITING, file=sys.stderr, flush=True)
    x = torch.ones(1)
    dist.all_reduce(x)
    if dist.get_rank() == 0:
        if args.exit_code:
            sys.exit(args.exit_code)
        try:
            {}["reduce_bucket_sise"]
        except KeyError as exc:
            raise ConfigError(MESSAGE) from exc  # a chained traceback: the last line counts
    dist.all_reduce(x)  # rank 1: the peer is gone
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
