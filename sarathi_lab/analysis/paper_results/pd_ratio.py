"""Fig. 9/11b: SARATHI's throughput over the baseline by P:D, peaking at C / (B - 1)."""
from sarathi_lab.analysis.paper_result import GpuRun, PaperResult

RESULT = PaperResult(
    name="pd_ratio", order=40, sim="pd_ratio",
    reading=("**Fig. 9/11b, P:D.** End-to-end throughput over the baseline peaks where one chunk and B "
             "- 1 decodes fill every iteration, P:D = C / (B - 1) (dashed); the paper's peaks as "
             "stars."),
    gpu=GpuRun(minutes=3.9, order=30,
               overrides="seq_len=1024 batch_size=18 chunk=256,512 pd_ratio=5,14,28,50 "
                         "workload.num_requests=54",
               dry="seq_len=48 pd_ratio=4 chunk=16 batch_size=2 workload.num_requests=2 scheduler=sarathi"),
)
