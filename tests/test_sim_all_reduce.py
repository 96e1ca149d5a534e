"""The tensor-parallel all-reduce from NCCL times measured by vidur: converted row for row, read
monotone in the message size, and used by the calibrated and profile cost models where measured
(the roofline elsewhere, said in a warning)."""
from __future__ import annotations

import warnings

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sarathi_lab.config import ConfigError
from sarathi_lab.measure.sim_check.convert_gpu_kernels import convert_all_reduce, kept_bytes
from sarathi_lab.model import load_config
from sarathi_lab.sim import CostModel
from sarathi_lab.sim import gpu_kernels as gk
from sarathi_lab.sim.parallel import AllReduce, measured_points, ring_s


def _vidur_rows(rows):
    """vidur's all_reduce.csv columns; rows of (num_workers, devices_per_node, size, median_ms)."""
    return pd.DataFrame([{"time_stats.all_reduce.min": ms / 2, "time_stats.all_reduce.median": ms,
                          "time_stats.all_reduce.max": ms * 2, "rank": 0, "num_workers": n, "size": size,
                          "collective": "all_reduce", "devices_per_node": per_node, "max_devices_per_node": 8}
                         for n, per_node, size, ms in rows])


def test_a_measured_row_in_is_the_same_seconds_out():
    raw = _vidur_rows([(2, 2, 2048, 0.011), (2, 1, 2048, 0.9), (4, 4, 2048, 0.02), (4, 4, 2048, 0.04),
                       (2, 2, 3 << 20, 0.1), (2, 2, (3 << 20) + (1 << 15), 0.2)])
    out = convert_all_reduce(raw, "a100")
    assert list(out.columns) == ["device", "tp", "bytes", "seconds"]
    two = out[out.tp == 2].set_index("bytes").seconds
    assert two[2048] == pytest.approx(11e-6)  # ms -> s; the row across two nodes (devices_per_node 1) left out
    assert out[out.tp == 4].seconds.tolist() == pytest.approx([30e-6])  # a repeated size: its median
    assert (3 << 20) in two.index and (3 << 20) + (1 << 15) not in two.index  # beyond 1 MiB every 256 KiB
    assert kept_bytes(2048) and kept_bytes(64 << 20) and not kept_bytes((16 << 20) + (1 << 18))


def test_the_shipped_table_holds_vidurs_medians():
    # vidur's a100_dgx all_reduce.csv: 2 GPUs, 2048 bytes, median 0.010 ms; 64 MiB, 0.430 ms.
    points = measured_points("a100", 2)
    assert points[2048] == pytest.approx(10e-6) and points[64 << 20] == pytest.approx(430e-6)
    assert set(gk.measured("a100", 2)) >= {"llama2-70b", "codellama-34b"} and "phi-2" not in gk.measured("a100", 2)
    assert measured_points("a40", 2) == {}


def test_a_measured_size_costs_what_was_measured_and_between_sizes_lies_between():
    ar = AllReduce(2, 10e-6, 240e9, ((4096, 20e-6), (8192, 30e-6), (1 << 20, 60e-6)))
    assert ar(8192) == pytest.approx(30e-6)
    assert ar(6144) == pytest.approx(25e-6)
    assert ar(100) == pytest.approx(20e-6)  # below the smallest: its latency, not less
    beyond = (1 << 20) + 240e9  # a ring of two moves the bytes once: 240 GB more take a second more
    assert ar(beyond) == pytest.approx(60e-6 + 1.0, rel=1e-9)
    assert AllReduce(1, 10e-6, 240e9)(1 << 20) == 0.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(1e-6, 1e-3), min_size=1, max_size=30), st.integers(2, 8),
       st.floats(1.0, 2.0**28), st.floats(1.0, 2.0**28))
def test_all_reduce_time_never_falls_with_a_larger_message(times, tp, a, b):
    """Whatever was measured (noise makes some larger messages faster), a larger message never costs less."""
    ar = AllReduce(tp, 10e-6, 240e9, tuple((4096 * (i + 1) ** 2, t) for i, t in enumerate(times)))
    lo, hi = sorted((a, b))
    assert ar(lo) <= ar(hi) + 1e-15


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = fn(*args, **kwargs)
    return value, " | ".join(str(w.message) for w in caught)


def test_calibrated_tensor_parallel_pays_the_measured_all_reduce_and_says_so():
    cm, said = _quiet(CostModel.for_device, "a100", "yi-34b", "calibrated", tp=2)
    assert cm.name == "calibrated" and "measured (vidur, A100 DGX node" in said
    tokens = 512 + 32
    cost = cm.iteration_cost([(512, 1024)], [2048] * 32)
    yi = load_config("yi-34b")
    one = measured_points("a100", 2)
    # 544 tokens x 7168 x 2 bytes = 7.8 MB lies between two measured sizes: their interpolation, twice a layer.
    nbytes = tokens * yi.hidden_size * 2
    lo, hi = max(b for b in one if b <= nbytes), min(b for b in one if b >= nbytes)
    assert one[lo] * 0.5 <= cost.ops["allreduce"] / (2 * yi.num_hidden_layers) <= one[hi] * 2
    shard = CostModel.for_device("a100", "yi-34b", "calibrated")
    assert cost.forward_s - cost.ops["allreduce"] < shard.iteration_cost([(512, 1024)], [2048] * 32).forward_s
    # The roofline keeps the ring formula: nothing measured enters it, and nothing is said.
    roof, said = _quiet(CostModel.for_device, "a100", "yi-34b", "roofline", tp=2)
    ring = 2 * yi.num_hidden_layers * ring_s(nbytes, 2, 10e-6, 240e9)
    assert roof.iteration_cost([(512, 1024)], [2048] * 32).ops["allreduce"] == pytest.approx(ring, rel=1e-12)
    assert said == ""


def test_where_nothing_was_measured_the_all_reduce_is_the_roofline_and_the_run_says_so():
    cm, said = _quiet(CostModel.for_device, "a40", "llama2-7b", "calibrated", tp=2)
    assert "the ring roofline" in said and "no all-reduce measured for 2 x a40" in said
    nbytes = 64 * 4096 * 2
    assert cm.iteration_cost([], [100] * 64).ops["allreduce"] == pytest.approx(2 * 32 * ring_s(nbytes, 2, 10e-6, 240e9))


def test_profile_tensor_parallel_reads_the_shards_measured_kernels():
    cm, said = _quiet(CostModel.for_device, "a100", "llama2-70b", "profile", tp=4)
    assert cm.name == "profile" and "a100/llama2-70b tp4" in said and "measured (vidur" in said
    shard = gk.kernels("a100", "llama2-70b", 4)
    # 2048 tokens: a measured point no larger neighbour undercuts (noise elsewhere is smoothed monotone).
    qkv = shard[(shard.op == "qkv_proj") & (shard.tokens == 2048)].seconds.iloc[0]
    assert cm.iteration_cost([(2048, 2048)], [], 1).ops["qkv_proj"] == pytest.approx(80 * qkv)
    with pytest.raises(ConfigError, match=r"^sim_cost_model='profile' is invalid for this model on "
                                          r"sim_device='a100' at sim_tp=2: its GPU kernels were not measured"):
        CostModel.for_device("a100", "phi-2", "profile", tp=2)


def test_an_engine_profile_refuses_tensor_parallelism(tmp_path, monkeypatch):
    """task=profile timed one device running the whole model: no shard can be read from it."""
    from pathlib import Path

    monkeypatch.setenv("SARATHI_PROFILES_DIR", str(tmp_path))
    (tmp_path / "a100").mkdir()
    source = Path(__file__).resolve().parents[1] / "profiles" / "cpu" / "cpu-small.csv"
    (tmp_path / "a100" / "llama2-7b.csv").write_text(source.read_text())
    with pytest.raises(ConfigError, match=r"^sim_tp=2 is invalid with sim_cost_model='profile' and a profile measured "
                                          r"by task=profile: it times one device running the whole model"):
        CostModel.for_device("a100", "llama2-7b", "profile", tp=2)
