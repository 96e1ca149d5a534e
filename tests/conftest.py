"""Set for the whole session before any test imports torch, and inherited by every process a test starts."""
import json
import os

import pytest

# The tests run on one pytest-xdist worker a core (pyproject's addopts), each process with torch's
# default threads. OpenMP threads that spin while they wait take the cores another worker needs, and
# every test of both slows down several times; sleeping ones cost a test little and change no result.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Under `SARATHI_ISA_AS=KIND` (tests/test_kernels_other_isas.py, or by hand with the kind's environment:
# measure/profiling/isa.py), torch's CPU feature probes answer as that kind, as bench.as_isa makes them, before
# the engine first asks them: bfloat16 then runs as float32 where the kind has no bf16 units.
if os.environ.get("SARATHI_ISA_AS"):
    from sarathi_lab.measure.profiling import isa

    isa.apply()


# The files that run for minutes (each a whole command at the papers' scale or every CI experiment),
# longest first: xdist hands files to its workers in collection order, so these start at once on
# different workers while the short files fill in around them, and no worker ends alone with one.
LONGEST_FIRST = ("test_published_claims.py", "test_notebooks.py", "test_sim_fig12.py",
                 "test_cuda_graphs.py", "test_sweep.py", "test_cli.py", "test_gpu_suite.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest as collected


@pytest.fixture(scope="session", autouse=True)
def cpu_ceilings(tmp_path_factory):
    """Synthetic CPU ceilings for every sim_device=cpu run (and the processes tests start): a unit
    test measures nothing, and reads the same figures on every machine."""
    from sarathi_lab.config import DTYPES
    from sarathi_lab.sim.device import CEILINGS_ENV, cpu_name

    path = tmp_path_factory.mktemp("ceilings") / "cpu_ceilings.json"
    entry = {"copy_gbps": 10.0, "matmul_gflops": 100.0, "threads": 1, "measured_at": "synthetic"}
    path.write_text(json.dumps({f"{cpu_name()}|{dtype}": entry for dtype in DTYPES}))
    os.environ[CEILINGS_ENV] = str(path)
    return path

@pytest.fixture(scope="module", autouse=True)
def fresh_shared_engine():
    """Each test file starts as a fresh process does: no engine kept by another file's runs (a sweep's
    jobs share one: model/shared_engine.py), nor its memory held past them."""
    yield
    from sarathi_lab.model.shared_engine import SHARED

    SHARED.release()
