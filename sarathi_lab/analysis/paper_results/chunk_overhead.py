"""Fig. 13: what chunking a prompt costs (attention, prefill, end to end, KV re-read)."""
from sarathi_lab.analysis.paper_result import GpuRun, PaperResult

RESULT = PaperResult(
    name="chunk_overhead", order=50, sim="chunk_overhead",
    reading=("**Fig. 13, chunking overhead.** Small chunks re-read the KV cache and run small matmuls: "
             "chunk 64 costs ~3x in attention; 256 / 512 keep the prefill within 20% / 10% (dotted: "
             "the paper's values)."),
    gpu=GpuRun(minutes=2.7, order=50,
               overrides="seq_len=1024,3072",
               dry="seq_len=64 chunk=32 pd_ratio=8"),
)
