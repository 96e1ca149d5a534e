"""The papers' numbers that more than one result reads (SARATHI arXiv 2308.16369, LLaMA-13B on an
A6000 unless noted; Sarathi-Serve arXiv 2403.02310). A number one result alone judges by lives in
that result's module (analysis/paper_results/)."""
from pathlib import Path

import yaml

from sarathi_lab.engine.tiles import GEMM_TILE

# The GPU's matmul tile is 128 tokens (Fig. 7).
TILE = GEMM_TILE

# §5.2: the largest batch of LLaMA-13B an A6000 holds at each length, as the paper ran it (Fig.
# 11a's batches, the batch sizes Fig. 8 could run there). A larger one at these lengths: a what-if.
LARGEST_BATCH = {1024: 18, 2048: 10, 3072: 6}

# Sarathi-Serve: P99 TBT inflation of hybrid batching without a budget. Read by the capacity and
# scheduler-latency results and the versus-vLLM comparison.
NAIVE_HYBRID_TBT_INFLATION = 28.3

# The paper's A6000 as the simulator's device file states it, read as data (no torch).
_A6000 = yaml.safe_load((Path(__file__).parents[1] / "sim" / "devices" / "a6000.yaml").read_text())
A6000_GFLOPS = _A6000["peak_flops"] / 1e9
A6000_GBPS = _A6000["memory_bandwidth"] / 1e9
