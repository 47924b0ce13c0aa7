"""3D parallelism for the engine: pipeline (torch.distributed.pipelining schedules), tensor
(torch.distributed.tensor.parallel plans) and ZeRO data parallelism over a DeviceMesh with
named ``pp``, ``dp`` and ``tp`` axes. DeepSpeed's pipeline API lives in :mod:`.pipe`.

Nothing is imported eagerly: the config reader imports this package's ``config`` module and
must stay cheap.
"""
