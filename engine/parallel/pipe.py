"""``deepspeed.pipe``: DeepSpeed's pipeline-parallel API on the bundled engine::

import zeroscope.engine as deepspeed
from zeroscope.engine.parallel.pipe import PipelineModule, LayerSpec

net = PipelineModule(layers=[LayerSpec(nn.Linear, 8, 8), lambda x: x.relu(), ...],
                     num_stages=2, loss_fn=nn.CrossEntropyLoss())
engine, _, _, _ = deepspeed.initialize(model=net, config=ds_config, training_data=dataset)
loss = engine.train_batch()
"""

from .pipe_data import RepeatingLoader
from .pipe_module import LayerSpec, PipelineError, PipelineModule, TiedLayerSpec
from .topology import PipeDataParallelTopology, PipeModelDataParallelTopology, ProcessTopology

__all__ = [
    "LayerSpec",
    "PipeDataParallelTopology",
    "PipeModelDataParallelTopology",
    "PipelineError",
    "PipelineModule",
    "ProcessTopology",
    "RepeatingLoader",
    "TiedLayerSpec",
]
