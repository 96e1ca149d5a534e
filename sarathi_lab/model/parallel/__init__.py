"""Tensor and pipeline parallelism of the real model on torch.distributed (gloo on CPUs, NCCL on
GPUs): weights' shards, stages' layers, the driver's executors and the ranks it spawns."""
