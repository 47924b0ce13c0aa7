"""ZeRO stage 3: parameters, gradients and optimizer state all sharded over the data-parallel
ranks; each module's full parameters exist only while it runs (Rajbhandari et al., ZeRO,
arXiv 1910.02054, P_os+g+p).

- ``partition``   flat padded shards and the all-gather / release primitives
- ``placement``   start-up without ``zero.Init``: buffers moved, parameters moved as cut
- ``coordinator`` which parameters to gather, prefetch, keep or release, learned from the trace
- ``hooks``       module forward/backward hooks that drive the coordinator
- ``grads``       reduce-scatter of gradients straight into the owner's shard
- ``strategy``    the engine's strategy protocol: memory accounting, ``save_16bit_model``
- ``save``        the consolidated 16-bit weights file (safetensors, no pickle)
"""

from .coordinator import register_external_parameter
from .strategy import Stage3Strategy

__all__ = ["Stage3Strategy", "register_external_parameter"]
