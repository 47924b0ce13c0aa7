"""The ``zeroscope`` command line: one verb per module under ``zeroscope/commands``.

Each verb module defines ``HELP`` (one line), ``add_arguments(parser)`` and ``main(args) -> int``.
Verb modules are imported only when their verb runs, so ``zeroscope estimate`` never pays for
torch or Textual. The process exit code is the verb's return value (for ``run``: the job's).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import signal
import sys
from types import ModuleType
from typing import Any, NoReturn

from . import __version__

VERBS: dict[str, str] = {
    "run": "launch a training script under torchrun with a collector and the live view",
    "replay": "open the live view on a recorded trace",
    "summary": "per-rank table and totals of a recorded trace",
    "export": "convert a trace (e.g. to Chrome/Perfetto JSON)",
    "estimate": "model-state memory per rank by the ZeRO formulas",
    "advise": "which ds_config change buys how much memory or time (a trace or a ds_config)",
    "serve": "headless collector and recorder for a job started elsewhere",
    "jobs": "list the collectors running on this machine",
    "attach": "open the live view on a job on another machine, over SSH",
    "relay": "forward one node's ranks to the job's collector over one connection",
}


class CliError(Exception):
    """A user error: printed as one line ``zeroscope: error: ...``, exit code 2."""


class VerbParser(argparse.ArgumentParser):
    """A verb's parser. argparse hands a sub-command's unknown flags up to the top-level parser,
    whose error shows ``zeroscope [-h] [--version] VERB ...``: no help for ``run --nprocs 2``.
    Here the verb reports them itself, with its own usage."""

    def parse_known_args(  # type: ignore[override]
        self, args: Any = None, namespace: Any = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}{self._did_you_mean(extras)}")
        return parsed, extras

    def _did_you_mean(self, extras: list[str]) -> str:
        """`` (did you mean --nproc-per-node?)`` for a mistyped flag, from the verb's own flags."""
        known = [s for a in self._actions for s in a.option_strings if s.startswith("--")]
        for extra in extras:
            if extra.startswith("--"):
                close = difflib.get_close_matches(extra.split("=", 1)[0], known, n=1, cutoff=0.75)
                if close:
                    return f" (did you mean {close[0]}?)"
        return ""

    def error(self, message: str) -> NoReturn:
        """A usage error in a few lines: a verb whose usage is long (``run`` lists every torchrun
        flag, 25 lines) gets one usage line and a pointer to ``--help``, not the wall of flags
        above the one line that says what was wrong."""
        usage = self.format_usage()
        if usage.count("\n") > 3:
            usage = f"usage: {self.prog} [flags] ... (every flag: {self.prog} --help)\n"
        self.exit(2, f"{usage}{self.prog}: error: {message}\n")


PIPE_CLOSED = 128 + signal.SIGPIPE
"""The exit code when our reader went away (``| head``), as a shell reports a SIGPIPE death."""


def quiet_stdout() -> None:
    """Point stdout at /dev/null (the Python docs' recipe for a closed pipe, see "Note on
    SIGPIPE" in the signal module's docs), so nothing, not even the interpreter's last flush,
    writes to it again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _load(verb: str) -> ModuleType:
    return importlib.import_module(f"zeroscope.commands.{verb}")


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser; only ``verb``'s module is imported (all of them for ``--help``)."""
    parser = argparse.ArgumentParser(
        prog="zeroscope",
        description="htop for ZeRO training: live per-rank P/G/O/A memory, "
        "collectives, loss scale and offload bandwidth.",
    )
    parser.add_argument("--version", action="version", version=f"zeroscope {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=VerbParser)
    for name, help_text in VERBS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if verb in (None, name):
            try:
                _load(name).add_arguments(p)
            except ModuleNotFoundError as exc:
                if exc.name != f"zeroscope.commands.{name}":
                    raise
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a verb; a reader that goes away (``zeroscope export t | head``) ends it quietly."""
    try:
        code = _main(sys.argv[1:] if argv is None else argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        quiet_stdout()
        return PIPE_CLOSED


def _main(argv: list[str]) -> int:
    verb = next((a for a in argv if a in VERBS), None)
    parser = build_parser(verb)
    args = parser.parse_args(argv)
    if args.verb is None:
        parser.print_help()
        return 2
    try:
        module = _load(args.verb)
    except ModuleNotFoundError as exc:
        if exc.name != f"zeroscope.commands.{args.verb}":
            raise
        print(f"zeroscope: error: '{args.verb}' is not available in this build", file=sys.stderr)
        return 2
    try:
        return int(module.main(args) or 0)
    except CliError as exc:
        print(f"zeroscope: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a trace found damaged part-way through a verb's reading
        from zeroscope.store.trace import TraceError

        if not isinstance(exc, TraceError):
            raise
        print(f"zeroscope: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
