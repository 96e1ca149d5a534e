"""Fig. 11a: baseline, Orca's worst and best case, and SARATHI by sequence length."""
from sarathi_lab.analysis.paper_result import GpuRun, PaperResult

RESULT = PaperResult(
    name="orca_compare", order=60, sim="orca_compare",
    reading=("**Fig. 11a, Orca.** Orca's worst case (lock step, no overlap) and best case (every later "
             "whole prefill with B - 1 decodes), run by the `orca` scheduler on two workloads (see "
             "`experiments/orca_compare.yaml`), beside SARATHI; the paper's bars on the right."),
    gpu=GpuRun(minutes=3.0, order=60,
               overrides="seq_len=1024,2048 batch_size=18 chunk=256 pd_ratio=15 workload.num_requests=54",
               dry="seq_len=48 chunk=16 pd_ratio=4 batch_size=2 workload.num_requests=4 scheduler=orca "
                   "workload.stagger=2"),
)
