"""Per-step host time of the decode workload in the main thread's CPU time, for A/B across commits.

The engine's wall clock is swapped for the main thread's CPU clock (time.thread_time), so that a
machine shared with other work does not count its waits: the host steps (schedule, prepare, sample,
update and the loop) run on the main thread alone. The forward pass's reading is then only the
main thread's share of it, so the script reports host microseconds, not shares.

    PYTHONPATH=<worktree> python benchmarks/scripts/host_steps.py [label] [dtype] [repeats]

Prints one line per measured run: medians over the full 16-decode iterations.
"""
import statistics
import sys
import time
import types
import warnings

from sarathi_lab.engine import clock

clock.time = types.SimpleNamespace(perf_counter=time.thread_time, sleep=time.sleep)

from sarathi_lab import LLM
from sarathi_lab.engine.sequence import SamplingParams
from sarathi_lab.measure.bench.trace import make_workload
from sarathi_lab.model import load_config

label = sys.argv[1] if len(sys.argv) > 1 else "run"
dtype = sys.argv[2] if len(sys.argv) > 2 else "bfloat16"
repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 2
prompts, new = make_workload(16, (16, 64), (256, 256), load_config("cpu-small").vocab_size, 0)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    llm = LLM("cpu-small", scheduler="sarathi_serve", chunk_size=256, max_batch_size=16, max_model_len=64 + 256,
              device="cpu", dtype=dtype, num_threads=1)
llm.generate(prompts[:4], [8] * 4, sampling=SamplingParams(ignore_eos=True))  # warm-up
for r in range(repeats):
    llm.generate(prompts, new, sampling=SamplingParams(ignore_eos=True))
    its = [i for i in llm.metrics.iterations if i.num_prefill_tokens == 0 and i.num_decode_requests == 16]
    med = {k: statistics.median(getattr(i, f"{k}_time") for i in its) * 1e6 for k in ("schedule", "prepare", "sample")}
    rest = statistics.median((i.duration - i.forward_time - i.schedule_time - i.prepare_time - i.sample_time)
                             for i in its) * 1e6
    host = statistics.median((i.duration - i.forward_time) for i in its) * 1e6
    print(f"{label} n={len(its)} host_us={host:.1f} schedule_us={med['schedule']:.1f} prepare_us={med['prepare']:.1f}"
          f" sample_us={med['sample']:.1f} rest_us={rest:.1f}", flush=True)
