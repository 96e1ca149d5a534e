"""Fig. 3/4: what a decode token costs against a prefill token, by operation and batch size."""
from sarathi_lab.analysis.paper_result import GpuRun, PaperResult

RESULT = PaperResult(
    name="per_token_cost", order=10, sim="per_token_cost",
    reading=("**Fig. 3/4, per-token cost.** At small batch a decode token costs one to two orders of "
             "magnitude more than a prefill token (200x at batch 1 on LLaMA-13B/A6000), and prefill "
             "throughput saturates early. Left: time per token by operation; right: the decode/prefill "
             "ratio, the paper's values as stars."),
    gpu=GpuRun(minutes=0.9, order=10,
               overrides="seq_len=1024 batch_size=1,2,4,8,12,18",
               dry="seq_len=32 batch_size=2"),
)
