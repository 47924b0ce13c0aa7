"""zeroscope's benchmarks: ``python -m bench`` (bench/__main__.py) runs every section and writes
docs/bench-results.{md,json}. harness.py holds the pure pieces (alternation, paired ratios,
tables), engine_compare.py + contenders.py the engine side by side, sections.py the adapters
over the standalone scripts (agent_overhead, ingest, tui_frame), gpu_check.py the CUDA rows."""
