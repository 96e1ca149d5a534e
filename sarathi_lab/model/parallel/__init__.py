"""Tensor parallelism of the real model on torch.distributed (gloo on CPUs, NCCL on GPUs): which
rows and columns of each weight a rank holds (sharding), the layers that join the ranks' partial
results (layers), the per-rank model (model), the batch the driver sends every step (wire), the
process group and its ranks (group), and the driver's executor and the other ranks' loop."""
