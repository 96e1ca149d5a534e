"""Tensor and pipeline parallelism of the real model on torch.distributed (gloo on CPUs, NCCL on GPUs):
which rows and columns of each weight a rank holds (sharding) and which layers its stage holds
(stages), the layers that join the ranks' partial results (layers), a stage's part of the forward
(pipeline), the batch the driver sends every step (wire), the process groups and their ranks (group),
how a pipeline's commands pass from rank to rank (chain), one rank's part of an engine (rank), when
each stage computed each micro-batch (timeline), the driver's executors (driver; pipelined: several
micro-batches in flight), the other ranks' loop (worker) and the ranks a driver spawns, whose lives
are tied to its own (spawn)."""
