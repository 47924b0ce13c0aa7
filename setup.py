"""Only the agent's optional C seam (agent/_seam.c); everything else is in pyproject.toml.

Built on Linux (its clock is perf_counter_ns's there); where it cannot be built the agent runs
its pure-Python seam (agent/comm.py), which is the same records by the same rules.
"""

import sys

from setuptools import Extension, setup

ext_modules = []
if sys.platform.startswith("linux"):
    ext_modules.append(
        Extension(
            "zeroscope.agent._seam", ["agent/_seam.c"], optional=True, extra_compile_args=["-O2"]
        )
    )

setup(ext_modules=ext_modules)
