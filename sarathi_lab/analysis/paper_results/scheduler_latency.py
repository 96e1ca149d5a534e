"""Sarathi-Serve: TTFT and TBT of the schedulers under Poisson load."""
from sarathi_lab.analysis import claims
from sarathi_lab.analysis.paper_result import GpuRun, PaperResult

RESULT = PaperResult(
    name="scheduler_latency", claims=claims.scheduler_latency, figure="scheduler_latency",
    order=70, sim="scheduler_latency",
    reading=("**Sarathi-Serve, latency.** TTFT and TBT (p50 solid, p99 dashed) of the five schedulers "
             "under Poisson load: stall-free batching keeps P99 TBT low."),
    ci=("seq_len=96", "workload.min_tokens=32", "chunk=32", "workload.num_requests=6", "workload.qps=20,80"),
    gpu=GpuRun(minutes=3.5, order=70,
               overrides="model=mistral-7b seq_len=4096 chunk=512 workload.num_requests=32 workload.qps=1,2 "
                         "scheduler=vllm,orca,sarathi_serve",
               what="Sarathi-Serve TBT: Mistral-7B, lengths <=4096, budget 512; scaled from 256 requests x "
                    "qps 1,2,4 x 5 schedulers to 32 requests x qps 1,2 x vllm/orca/sarathi_serve",
               dry="seq_len=64 workload.min_tokens=32 chunk=32 workload.num_requests=3 workload.qps=50 "
                   "scheduler=sarathi_serve"),
)
