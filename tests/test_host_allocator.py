"""A CPU engine keeps freed host memory for reuse (model/host_allocator.py): a large activation freed
in one layer is not page-faulted in again by the next, unless the user tuned glibc's malloc."""
import json
import os
import subprocess
import sys

import pytest

# Page faults of filling a fresh 64 MB tensor after an equal one was freed, before and after an
# engine is built on the CPU, in a fresh interpreter (the setting is process-wide and one-way). After
# the engine, one round settles first: MKL's first GEMM keeps small buffers of its own inside memory
# freed before it, so the next large tensor grows the heap once (then every later one reuses it).
_PROBE = """
import json, resource, torch
from sarathi_lab import LLM
from sarathi_lab.model.host_allocator import reuse_freed_memory

def faults():
    torch.empty(2**24).fill_(1.0)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.empty(2**24).fill_(1.0)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

before = faults()
LLM("tiny", device="cpu", dtype="float32", warmup_iters=0, num_kv_blocks=8)
faults()
print(json.dumps({"before": before, "after": faults(), "reusing": reuse_freed_memory()}))
"""


def _probe(**env) -> dict:
    env = {k: v for k, v in os.environ.items() if not (k.startswith("MALLOC_") or k == "GLIBC_TUNABLES")} | env
    done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _needs_small_pages(result: dict) -> None:
    if result["before"] < 1000:  # 16,384 faults with 4 KB pages; transparent huge pages hide them
        pytest.skip(f"a fresh 64 MB tensor took only {result['before']} page faults here (huge pages)")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_cpu_engine_reuses_freed_pages_instead_of_faulting_them_in_again():
    result = _probe()
    _needs_small_pages(result)
    assert result["reusing"]
    assert result["after"] < result["before"] // 20, result


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_user_tuned_malloc_is_left_as_the_user_set_it():
    result = _probe(MALLOC_MMAP_MAX_="65536")
    _needs_small_pages(result)
    assert not result["reusing"]
    assert result["after"] > result["before"] // 2, result
