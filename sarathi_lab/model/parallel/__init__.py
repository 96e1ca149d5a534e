"""Tensor and pipeline parallelism of the real model on torch.distributed (gloo, NCCL)."""
