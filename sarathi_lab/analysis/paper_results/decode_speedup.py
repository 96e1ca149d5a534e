"""Fig. 8: decode throughput of piggybacked decodes over decode-only batches."""
from sarathi_lab.analysis.paper_result import GpuRun, PaperResult

RESULT = PaperResult(
    name="decode_speedup", order=30, sim="decode_speedup",
    reading=("**Fig. 8, decode speedup.** A decode riding a prefill chunk costs a fraction of one in a "
             "decode-only iteration: 2.8x-10x decode throughput (shaded band). The paper sizes the chunk so that "
             "chunk + riding decodes fill whole 128-token tiles; the simulated runs sweep that "
             "tile-aligned chunk beside the fixed chunk of 256, one panel each, and the claim is judged on the "
             "aligned one."),
    gpu=GpuRun(minutes=0.9, order=20,
               overrides="chunk=256 seq_len=1024,2048,3072 batch_size=2,6,12,18",
               dry="seq_len=48 batch_size=2 chunk=16"),
)
