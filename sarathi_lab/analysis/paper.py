"""The papers' numbers (SARATHI arXiv 2308.16369, LLaMA-13B on an A6000 unless noted;
Sarathi-Serve arXiv 2403.02310)."""
from pathlib import Path

import yaml

from sarathi_lab.engine.tiles import GEMM_TILE

# Fig. 3/4 at sequence length 1024: decode over prefill per-token time, by batch size.
DECODE_OVER_PREFILL = {1: 200.0, 2: 100.0, 18: 16.7}
# Fig. 4: prefill throughput saturates at about 180 tokens/ms once batch x length reaches 512.
# Fig. 4a's rate is one layer's: LLaMA-13B's LAYERS run a token that many times slower.
PREFILL_SATURATION_TOKENS = 512
PREFILL_TOKENS_PER_MS = 180.0
LAYERS = 40

# Fig. 7: iteration time (ms) by tokens in the batch; the GPU's matmul tile is 128 tokens.
TILE = GEMM_TILE
TILE_TIMES_MS = {128: 55.0, 256: 69.8, 257: 92.33}
TILE_JUMP = TILE_TIMES_MS[257] / TILE_TIMES_MS[256] - 1

# Fig. 8 (chunk 256): decode throughput over the baseline, across batch sizes and lengths 1K-3K.
DECODE_SPEEDUP = (2.8, 10.0)
DECODE_SPEEDUP_33B_A100 = 4.25

# §5.2: the largest batch of LLaMA-13B an A6000 holds at each length, as the paper ran it (Fig.
# 11a's batches, the batch sizes Fig. 8 could run there). A larger one at these lengths: a what-if.
LARGEST_BATCH = {1024: 18, 2048: 10, 3072: 6}

# Fig. 9 / 11b: the gain peaks at P:D = C / (B - 1); about 10% over a wide range of P:D.
PD_PEAKS = [  # (chunk, batch_size, pd_ratio, normalised throughput)
    (256, 18, 14, 1.27),
    (512, 18, 28, 1.23),
]
PD_WIDE_GAIN = 1.10

# Fig. 13: chunked over unchunked time.
CHUNK64_ATTENTION_SLOWDOWN = 3.0
CHUNK64_PREFILL_SLOWDOWN = 5.0
PREFILL_SLOWDOWN_BOUND = {256: 1.20, 512: 1.10}
# Fig. 13c: a batch's end-to-end throughput over the baseline with decodes riding, by chunk: chunk
# 64 about the baseline, 128 up to 1.16x, 256 above 320.
CHUNK_BATCH_GAIN = {64: 1.0, 128: 1.16}
CHUNK_BATCH_ABOVE = (256, 320)

# Fig. 11a: throughput over the baseline by sequence length.
ORCA_FIG11A = {
    "Orca best": {1024: 1.11, 2048: 1.0, 3072: 1.0},
    "SARATHI": {1024: 1.27, 2048: 1.25, 3072: 1.23},
}

# Sarathi-Serve: P99 TBT inflation of hybrid batching without a budget; capacity over vLLM
# (Mistral-7B on one A100; Yi-34B on two); 512-token chunks' prefill overhead.
NAIVE_HYBRID_TBT_INFLATION = 28.3
CAPACITY_GAIN_OVER_VLLM = 2.6
CAPACITY_TP_GAIN_OVER_VLLM = 3.7
CHUNK512_PREFILL_OVERHEAD = 0.25

# The paper's A6000 as the simulator's device file states it, read as data (no torch).
_A6000 = yaml.safe_load((Path(__file__).parents[1] / "sim" / "devices" / "a6000.yaml").read_text())
A6000_GFLOPS = _A6000["peak_flops"] / 1e9
A6000_GBPS = _A6000["memory_bandwidth"] / 1e9
