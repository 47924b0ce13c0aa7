"""``python -m bench``: every benchmark in one run, written to docs/bench-results.{md,json}.

    python -m bench                      # full run, ~10-15 min on 2 cores
    python -m bench --quick              # smaller sizes, fewer rounds, ~3 min
    python -m bench --only engine,agent  # sections: engine, agent, attach, ingest, tui, gpu, pipeline, relay, storage, throughput
    python -m bench --update-docs        # also refresh the tables in docs/bench.md

Each section is independent: one that fails is recorded as failed in the table and the rest
still run. Comparisons are ratios within this run (see bench/harness.py), so the absolute
times only describe this machine at this moment; the load average is recorded beside them.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from bench import sections
from bench.harness import Table, load_average, machine_description, render_markdown, to_json

ROOT = Path(__file__).resolve().parent.parent
SECTIONS: dict[str, Callable[[bool], list[Table]]] = {
    "engine": sections.engine,
    "agent": sections.agent,
    "attach": sections.attach,
    "ingest": sections.ingest,
    "tui": sections.tui,
    "gpu": sections.gpu,
    "pipeline": sections.pipeline,
    "relay": sections.relay,
    "storage": sections.storage,
    "throughput": sections.throughput,
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer rounds")
    parser.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated sections: {','.join(SECTIONS)}"
    )
    parser.add_argument(
        "--out",
        default=str(ROOT / "docs" / "bench-results"),
        help="output path without suffix (.md and .json are written)",
    )
    parser.add_argument(
        "--update-docs",
        action="store_true",
        help="also put the new tables into docs/bench.md (between its markers)",
    )
    args = parser.parse_args(argv)
    args.sections = [s for s in args.only.split(",") if s]
    unknown = [s for s in args.sections if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    return args


START, END = "<!-- results:start", "<!-- results:end -->"


def update_docs(doc: Path, markdown: str) -> None:
    """Replace the results between the markers in ``doc`` with ``markdown`` (less its title);
    the interpretation around them is written by people and stays."""
    text = doc.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{doc}: no {START} ... {END} markers to replace")
    head, rest = text.split(START, 1)
    marker_line, _ = rest.split("\n", 1)
    _, tail = rest.split(END, 1)
    body = markdown.split("\n", 1)[1].strip()
    doc.write_text(f"{head}{START}{marker_line}\n{body}\n{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python -m bench" + (" --quick" if args.quick else "")
    if args.only != ",".join(SECTIONS):
        command += f" --only {args.only}"
    machine = machine_description()
    tables: list[Table] = []
    t0 = time.perf_counter()
    for name in args.sections:
        start = time.perf_counter()
        print(f"[bench] {name} ...", flush=True)
        try:
            tables += SECTIONS[name](args.quick)
        except Exception as exc:  # one broken section must not lose the others' numbers
            traceback.print_exc()
            failed = Table(title=f"{name}: failed", columns=["error"])
            failed.add(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            tables.append(failed)
        print(f"[bench] {name} done in {time.perf_counter() - start:.0f} s", flush=True)
    machine["load average at end (1 min)"] = load_average()
    machine["bench wall time s"] = round(time.perf_counter() - t0)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    markdown = render_markdown(machine, tables, command=command)
    out.with_suffix(".md").write_text(markdown)
    out.with_suffix(".json").write_text(to_json(machine, tables, command=command))
    if args.update_docs:
        update_docs(ROOT / "docs" / "bench.md", markdown)
    print(markdown)
    print(f"[bench] wrote {out.with_suffix('.md')} and {out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
