"""Fig. 7: iteration time steps at multiples of the matmul tile."""
from sarathi_lab.analysis.paper_result import GpuRun, PaperResult

RESULT = PaperResult(
    name="tile_quantization", order=20, sim="tile_quantization",
    reading=("**Fig. 7, tile quantization.** On a GPU the iteration time steps up at multiples of the "
             "matmul tile (256 -> 257 tokens: +32%). Right: time relative to one tile's, the paper's "
             "three points as stars."),
    gpu=GpuRun(minutes=1.4, order=40,
               overrides="seq_len=1024 measure.token_step=8",
               dry="seq_len=48 measure.token_step=16 measure.tile=32"),
)
