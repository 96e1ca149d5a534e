"""The simulator's cost models, device descriptions and memory arithmetic."""
from __future__ import annotations

import dataclasses
import itertools
import statistics
import warnings

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig

from sarathi_lab.config import ConfigError, EngineConfig
from sarathi_lab.model import PRESETS
from sarathi_lab.model.shape import Shape
from sarathi_lab.sim import CostModel, kv_capacity_tokens, load_device, max_batch
from sarathi_lab.sim.device import GPU_DEVICES
from sarathi_lab.sim.interpolate import Curve, Surface, isotonic
from sarathi_lab.sim.profile_model import ProfileCostModel
from sarathi_lab.sim.roofline import RooflineCostModel
from tests.kv_plans import sim_blocks

LLAMA2_7B_LAYER_PARAMS = 4096 * 3 * 4096 + 4096 * 4096 + 3 * 4096 * 11008  # qkv, o, gate_up, down


def bare(name: str, **changes):
    """A GPU without kernel floors or host time, so that a hand count is the whole answer."""
    return dataclasses.replace(load_device(name), kernel_floor_s=0.0, host_overhead_s=0.0, host_per_token_s=0.0,
                               **changes)


def test_every_gpu_description_loads_and_names_its_sources():
    assert set(GPU_DEVICES) == {"a40", "a6000", "a100", "h100", "h200"}
    for name in GPU_DEVICES:
        device = load_device(name)
        assert device.sources and device.peak_flops > 1e14 and device.memory_bandwidth > 5e11
    a6000 = load_device("a6000")
    assert (a6000.peak_flops, a6000.memory_bandwidth) == (154.8e12, 768e9)


def test_a_bad_device_value_fails_with_one_line():
    with pytest.raises(ConfigError, match=r"sim.device.h100.bandwidth_efficiency=1.5 is invalid"):
        dataclasses.replace(load_device("h100"), bandwidth_efficiency=1.5)
    with pytest.raises(ConfigError, match=r"peak_flops=nan is invalid"):
        dataclasses.replace(load_device("h100"), peak_flops=float("nan"))
    with pytest.raises(ConfigError, match=r"^sim.device.h100.kv_reread=1 is invalid: must be true or false$"):
        dataclasses.replace(load_device("h100"), kv_reread=1)
    with pytest.raises(ConfigError, match=r"sim_device='tpu' is invalid: allowed values are a100, a40, a6000"):
        CostModel.for_device("tpu")


def test_roofline_decode_reads_every_weight_once_at_the_bandwidth():
    # One decode with one token of context on an H100: memory bound, so the forward is the bytes
    # it must move over the effective bandwidth, counted here by hand.
    device = bare("h100")
    cm = RooflineCostModel(device, PRESETS["llama2-7b"])
    layers, hidden, e = 32, 4096, 2
    gemm_bytes = layers * (LLAMA2_7B_LAYER_PARAMS + 1 * (4096 + 12288) + 1 * (4096 + 4096)
                           + 1 * (4096 + 22016) + 1 * (11008 + 4096)) * e
    pointwise = layers * (8 * hidden + 2 * (4096 + 4096) + 3 * 11008) * e
    attention = layers * (1 * 2 * 4096 + 1 * (2 * 4096 + 2 * 4096)) * e   # read 1 cached K/V row, q/o, write K/V
    head = (32000 * 4096 + 4096 + 32000) * e + 2 * hidden * e             # LM head of one row + embedding row
    expected = (gemm_bytes + pointwise + attention + head) / (3350e9 * 0.9)
    cost = cm.iteration_cost(decodes=[1])
    # Decode attention streams at attention_bandwidth_efficiency, not bandwidth_efficiency.
    attention_fix = attention / (3350e9 * 0.8) - attention / (3350e9 * 0.9)
    assert cost.forward_s == pytest.approx(expected + attention_fix, rel=1e-12)
    assert 4.3e-3 < cost.forward_s < 4.5e-3  # 13 GB of bf16 weights at ~3 TB/s


def test_roofline_large_prefill_is_compute_bound_with_the_tile_padding():
    cm = RooflineCostModel(bare("h100"), PRESETS["llama2-7b"])
    rate = 989e12 * 0.81
    for tokens, padded in ((1024, 1024), (1025, 1152), (257, 384)):
        ops = cm.iteration_cost(prefills=[(tokens, tokens)]).ops
        gemms = sum(ops[k] for k in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"))
        assert gemms == pytest.approx(2 * padded * LLAMA2_7B_LAYER_PARAMS * 32 / rate, rel=1e-12)


def test_roofline_attention_by_hand():
    config = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)
    device = bare("a100", attention_tile=4, peak_flops=1e6, attention_flops_efficiency=1.0)
    cm = RooflineCostModel(device, config)
    # Chunk of 3 tokens after 5 cached: rows see 6, 7, 8 keys = 21 pairs; queries padded 3 -> 4;
    # 4 flops per pair per head-dim element: 4 * 64 * 21 * 4 / 3 flops at 1 MFLOP/s (compute bound).
    assert cm.prefill_attention_s(3, 8) == pytest.approx(4 * 64 * 21 * 4 / 3 / 1e6)
    # Memory bound: 2 * 32 * 2 bytes of K/V per context token and read, plus each query's q/o and new
    # K/V (256 + 256). 9 queries are 3 blocks of 4, each reading the context; once without rereads.
    slow = bare("a100", attention_tile=4, attention_bandwidth_efficiency=1.0, memory_bandwidth=1e9, peak_flops=1e18)
    assert RooflineCostModel(slow, config).prefill_attention_s(9, 100) == pytest.approx((3 * 100 * 256 + 9 * 512) / 1e9)
    once = RooflineCostModel(dataclasses.replace(slow, kv_reread=False), config)
    assert once.prefill_attention_s(9, 100) == pytest.approx((100 * 256 + 9 * 512) / 1e9)
    # Decodes are memory bound: 2 * 64 * 2 bytes per cached token, plus q/o and the new K/V.
    fast = bare("a100", attention_bandwidth_efficiency=1.0, memory_bandwidth=1e9)
    expected = ((10 + 20) * 256 + 2 * (256 + 256)) / 1e9
    assert RooflineCostModel(fast, config).decode_attention_s([10, 20]) == pytest.approx(expected)


def test_roofline_reproduces_the_papers_a6000_shapes_roughly():
    # Not fitted to these: a check that the device description lands near the paper's A6000 figures.
    cm = CostModel.for_device("a6000", model="llama-13b")
    t = {n: cm.iteration_time_s(prefills=[(n, n)]) for n in (128, 256, 257)}
    assert 1.2 < t[257] / t[256] < 1.6                               # paper Fig. 7: +32%
    prefill_per_token = cm.iteration_time_s(prefills=[(1024, 1024)]) / 1024
    assert 100 < cm.iteration_time_s(decodes=[1024]) / prefill_per_token < 300   # paper Fig. 3: 200x at B=1


@settings(max_examples=60, deadline=None)
@given(device=st.sampled_from(GPU_DEVICES), chunk=st.integers(1, 2048), before=st.integers(0, 2048),
       decodes=st.lists(st.integers(1, 4096), max_size=20), more=st.integers(1, 300))
def test_roofline_is_monotone_in_tokens_and_context(device, chunk, before, decodes, more):
    cm = CostModel.for_device(device, model="llama2-7b")
    base = cm.iteration_time_s(prefills=[(chunk, chunk + before)], decodes=decodes)
    assert cm.iteration_time_s(prefills=[(chunk + more, chunk + more + before)], decodes=decodes) >= base
    assert cm.iteration_time_s(prefills=[(chunk, chunk + before + more)], decodes=decodes) >= base
    assert cm.iteration_time_s(prefills=[(chunk, chunk + before)], decodes=[d + more for d in decodes]) >= base
    assert cm.iteration_time_s(prefills=[(chunk, chunk + before)], decodes=decodes + [more]) >= base


def test_bad_batches_fail_with_one_line():
    cm = CostModel.for_device("h100", model="tiny")
    with pytest.raises(ValueError, match=r"prefill \(10, 5\) is invalid"):
        cm.iteration_time_s(prefills=[(10, 5)])
    with pytest.raises(ValueError, match="decode context 0 is invalid"):
        cm.iteration_time_s(decodes=[0])
    assert cm.iteration_time_s() == 0.0


# --- memory ---------------------------------------------------------------------------------

def test_kv_capacity_gives_the_papers_batch_of_18_for_llama13b_at_1k_on_an_a6000():
    a6000, config = load_device("a6000"), PRESETS["llama-13b"]
    assert Shape.of(config).weight_bytes(2) == pytest.approx(26.03e9, rel=1e-3)
    assert Shape.of(config).kv_bytes_per_token(2) == 2 * 40 * 5120 * 2
    # The bare formula floor((M_gpu - M_weights) / (L m_kv)) gives 30 requests; the paper's 18
    # follows once the engine's 0.9 share and the B x 1K-token prefill's activations are kept back.
    shape = Shape.of(config)
    bare_formula = (a6000.memory_bytes - shape.weight_bytes(2)) // (1024 * shape.kv_bytes_per_token(2))
    assert bare_formula == 30
    assert max_batch(a6000, config, 1024) == 18
    assert max_batch(a6000, config, 2048) < max_batch(a6000, config, 1024)


def _sim_engine(scheduler: str, model: str = "llama-13b", device: str = "a6000", context: int = 1024,
                batch: int = 32, **knobs) -> EngineConfig:
    return EngineConfig(model=model, executor="sim", sim_device=device, scheduler=scheduler, max_batch_size=batch,
                        chunk_size=256, max_model_len=context, scheduler_knobs=knobs)


@pytest.mark.parametrize("scheduler", ["vllm", "orca", "static"])
def test_the_engines_kv_rule_gives_whole_prompt_schedulers_the_papers_batch_of_18(scheduler):
    # A scheduler that prefills whole prompts can put every request the cache holds into one
    # iteration: the rule keeps their activations back with them, as the paper's B does.
    config = PRESETS["llama-13b"]
    tokens = sim_blocks(_sim_engine(scheduler), config, 1024) * 16
    assert tokens // 1024 == max_batch(load_device("a6000"), config, 1024) == 18
    # A chunking scheduler keeps back one chunk's: more requests fit.
    assert sim_blocks(_sim_engine("sarathi"), config, 1024) * 16 // 1024 == 24


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["vllm", "orca", "static"]), st.sampled_from([("mistral-7b", "a100"), ("llama-13b", "a6000"),
                                                                     ("yi-34b", "h100")]),
       st.sampled_from([512, 1024, 4096]), st.integers(1, 256), st.one_of(st.none(), st.integers(1, 20000)))
def test_no_iteration_a_whole_prompt_scheduler_can_build_overflows_the_gpu(scheduler, where, context, batch, cap):
    model, device = where
    knobs = {"max_num_batched_tokens": cap} if scheduler == "vllm" and cap is not None else {}
    config, dev = PRESETS[model], load_device(device)
    shape = Shape.of(config)
    kv_tokens = sim_blocks(_sim_engine(scheduler, model, device, context, batch, **knobs), config,
                                    context) * 16
    # Its largest iteration: max_batch_size prompts, no more tokens than the cache holds, and with a
    # cap, prompts up to the cap or one longer prompt alone.
    largest = min(batch * context, kv_tokens)
    if knobs:
        largest = min(largest, max(cap, context))
    cache, activations = kv_tokens * shape.kv_bytes_per_token(2), largest * shape.activation_bytes_per_token(2)
    assert shape.weight_bytes(2) + cache + activations <= int(dev.memory_bytes * 0.9)


def test_kv_capacity_formula():
    device = dataclasses.replace(load_device("a100"), memory_bytes=100 * 2**30)
    config = PRESETS["llama2-7b"]
    free = int(100 * 2**30 * 0.9) - Shape.of(config).weight_bytes(2)
    assert kv_capacity_tokens(device, config) == free // (2 * 32 * 4096 * 2)
    with pytest.raises(ConfigError, match="leave no room for a KV cache"):
        kv_capacity_tokens(dataclasses.replace(device, memory_bytes=2**30), config)


# --- interpolation and the profile cost model -----------------------------------------------

def test_curve_and_surface_are_exact_at_measured_points_and_linear_between():
    curve = Curve({1: 1.0, 3: 2.0, 7: 10.0})
    assert [curve(x)[0] for x in (1, 3, 7)] == [1.0, 2.0, 10.0]
    assert curve(5) == (6.0, False)
    assert curve(9) == (14.0, True)                         # extrapolated along the last segment
    surface = Surface({(x, y): x * 10 + y for x in (1, 2) for y in (0, 4)})
    assert all(surface(x, y) == (x * 10 + y, False) for x in (1, 2) for y in (0, 4))
    assert surface(1.5, 2) == (17.0, False)
    assert surface(3, 2)[1] and surface(1, 5)[1]


def test_measured_dips_are_treated_as_noise():
    curve = Curve({1: 1.0, 2: 0.5, 3: 2.0})
    assert [curve(x)[0] for x in (1, 2, 3)] == [0.75, 0.75, 2.0]    # the pooled pair's median


def test_one_slow_point_does_not_lift_the_points_after_it():
    # A stall at x=2: a least-squares fit would raise x=2..5 to their mean, 2.15.
    curve = Curve({1: 1.0, 2: 5.0, 3: 1.1, 4: 1.2, 5: 1.3})
    assert [curve(x)[0] for x in (1, 2, 3, 4, 5)] == [1.0, 1.2, 1.2, 1.2, 1.3]
    assert isotonic([1.0, 5.0, 1.1, 1.2, 1.3]) == pytest.approx([1.0, 2.15, 2.15, 2.15, 2.15])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=10))
def test_median_isotonic_is_the_closest_monotone_fit_in_absolute_error(ys):
    fit = isotonic(ys, statistics.median)
    assert all(a <= b for a, b in itertools.pairwise(fit))
    # The best non-decreasing fit in absolute error can be taken from the data's own values:
    # against every non-decreasing sequence of them, ours is no worse.
    cost = sum(abs(f - y) for f, y in zip(fit, ys))
    values = sorted(set(ys))
    best = [0.0] * len(values)  # best[k]: least cost of the prefix so far, its last value values[k]
    for y in ys:
        below = list(itertools.accumulate(best, min))  # the prefix may end at any value up to values[k]
        best = [below[k] + abs(v - y) for k, v in enumerate(values)]
    assert cost <= min(best) + 1e-6 * (1 + sum(abs(y) for y in ys))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=12), st.lists(st.floats(0, 1), min_size=1, max_size=12))
def test_surfaces_are_monotone_whatever_was_measured(xs_noise, ys_noise):
    points = {(i, j): a + b for i, a in enumerate(xs_noise) for j, b in enumerate(ys_noise[::-1])}
    rows = [row.ys for row in Surface(points).rows]
    assert all(r[j] <= r[j + 1] for r in rows for j in range(len(r) - 1))
    assert all(rows[i][j] <= rows[i + 1][j] for i in range(len(rows) - 1) for j in range(len(rows[0])))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.floats(0, 1), min_size=1, max_size=8), min_size=1, max_size=6))
def test_a_ragged_surface_is_monotone_along_each_row_and_exact_inside_it(rows_noise):
    # Row x measured at its own points, as task=profile measures each chunk after the prefixes that fit.
    points = {(x, 10 * j): z for x, noise in enumerate(rows_noise) for j, z in enumerate(noise)}
    surface = Surface(points)
    assert all(r.ys[j] <= r.ys[j + 1] for r in surface.rows for j in range(len(r.ys) - 1))
    for x, noise in enumerate(rows_noise):
        assert not surface(x, 10 * (len(noise) - 1))[1] and surface(x, 10 * len(noise))[1]


def synthetic_profile(tokens=(1, 8, 16, 32, 64), chunks=(8, 32, 64), befores=(0, 64, 128), batches=(1, 4, 8),
                      contexts=(16, 128, 256)) -> pd.DataFrame:
    """A profile whose every op is a known increasing function of its axes."""
    rows = []
    for t in tokens:
        rows += [("qkv_proj", t, t, 1, 1e-3 + 2e-5 * t), ("o_proj", t, t, 1, 1e-4 + 1e-5 * t),
                 ("ffn", t, t, 1, 2e-3 + 5e-5 * t), ("others", t, t, 1, 1e-4 + 1e-6 * t),
                 ("prepare", t, t, 1, 1e-5 + 1e-7 * t + 2e-6)]
    rows += [("prefill_attention", c, c + b, 1, 1e-6 * c * (c + b)) for c in chunks for b in befores]
    rows += [("decode_attention", n, x, n, 1e-6 * n * x) for n in batches for x in contexts]
    rows += [("lm_head", n, 0, n, 1e-4 * n) for n in batches]
    rows += [("prepare", n, n * 100, n, 1e-5 + 1e-7 * n + 2e-6 * n) for n in batches]
    rows += [("sample", n, 0, n, 5e-6 + 1e-6 * n) for n in batches]
    return pd.DataFrame(rows, columns=["op", "tokens", "context", "batch", "seconds"])


@pytest.fixture
def profile_model():
    return ProfileCostModel(synthetic_profile(), PRESETS["tiny"])


def test_profile_model_is_exact_at_measured_points(profile_model):
    dense = lambda t: 1e-3 + 2e-5 * t + 1e-4 + 1e-5 * t + 2e-3 + 5e-5 * t + 1e-4 + 1e-6 * t
    cost = profile_model.iteration_cost(prefills=[(32, 96)])
    assert cost.forward_s == pytest.approx(dense(32) + 1e-6 * 32 * 96)
    assert cost.prepare_s == pytest.approx(1e-5 + 1e-7 * 32 + 2e-6)
    assert cost.sample_s == pytest.approx(5e-6 + 1e-6)
    cost = profile_model.iteration_cost(decodes=[128] * 4)
    assert cost.forward_s == pytest.approx(dense(4) + 1e-6 * 4 * 128 + 1e-4 * 4 - 1e-4)
    assert not cost.extrapolated


@settings(max_examples=60, deadline=None)
@given(chunk=st.integers(1, 64), before=st.integers(0, 128), decodes=st.lists(st.integers(16, 256), max_size=8),
       more=st.integers(1, 40))
@pytest.mark.parametrize("shared", [0.0, 2e-4])
def test_profile_model_is_monotone_in_tokens_and_context(chunk, before, decodes, more, shared):
    table = synthetic_profile()
    # With hybrid rows too, whose shared cost exceeds the smallest parts: adding work never saves time.
    hybrids = pd.DataFrame([("hybrid_attention", c, 128, n, 1e-6 * c * c + 1e-6 * n * 128 - shared)
                            for c in (32, 64) for n in (1, 8)], columns=table.columns)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cm = ProfileCostModel(pd.concat([table, hybrids]) if shared else table, PRESETS["tiny"])
        base = cm.iteration_time_s(prefills=[(chunk, chunk + before)], decodes=decodes)
        assert cm.iteration_time_s(prefills=[(chunk + more, chunk + more + before)], decodes=decodes) >= base
        assert cm.iteration_time_s(prefills=[(chunk, chunk + before + more)], decodes=decodes) >= base
        assert cm.iteration_time_s(prefills=[(chunk, chunk + before)], decodes=[d + more for d in decodes]) >= base
        assert cm.iteration_time_s(prefills=[(chunk, chunk + before)], decodes=[*decodes, 16]) >= base


def test_a_hybrid_pays_the_attention_cost_its_measured_hybrids_share_once():
    # Hybrid rows measured 30 us below their parts' sum: a launch-bound attention layer's fixed cost,
    # which the prefill-only and the decode-only rows each carry, paid once by a hybrid.
    shared, table = 3e-5, synthetic_profile()
    hybrids = pd.DataFrame([("hybrid_attention", c, 128, n, 1e-6 * c * c + 1e-6 * n * 128 - shared)
                            for c in (32, 64) for n in (1, 8)], columns=table.columns)
    plain, with_hybrids = (ProfileCostModel(t, PRESETS["tiny"]) for t in (table, pd.concat([table, hybrids])))
    # Without hybrid rows, the cheapest attention measured (one decode of 16 tokens) is what is shared.
    floor = 1e-6 * 1 * 16
    assert plain.attention_shared_s == pytest.approx(floor) and with_hybrids.attention_shared_s == pytest.approx(shared)
    batch = {"prefills": [(32, 96)], "decodes": [128] * 4}
    assert with_hybrids.iteration_time_s(**batch) == pytest.approx(plain.iteration_time_s(**batch) - (shared - floor))
    two_chunks = {"prefills": [(32, 96), (8, 8)], "decodes": [128] * 4}
    assert with_hybrids.iteration_time_s(**two_chunks) == pytest.approx(plain.iteration_time_s(**two_chunks)
                                                                         - 2 * (shared - floor))
    # A lone part pays its whole measured time.
    for alone in ({"prefills": [(32, 96)]}, {"decodes": [128] * 4}):
        assert with_hybrids.iteration_time_s(**alone) == pytest.approx(plain.iteration_time_s(**alone))


def test_past_the_profiled_tokens_the_devices_roofline_prices_the_increment():
    class Line:  # a device whose dense work costs 1 ms a token
        def dense_s(self, tokens: int) -> float:
            return 1e-3 * tokens

    plain = ProfileCostModel(synthetic_profile(), PRESETS["tiny"])
    priced = ProfileCostModel(synthetic_profile(), PRESETS["tiny"], beyond=Line())
    dense = lambda model, tokens: model.iteration_cost(prefills=[(tokens, tokens)]).ops["dense"]
    assert dense(priced, 32) == dense(plain, 32) and dense(priced, 64) == dense(plain, 64)  # inside: as measured
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # past the grid: flagged and warned, as any extrapolation
        assert dense(priced, 256) == pytest.approx(dense(plain, 64) + 1e-3 * (256 - 64))
        assert priced.iteration_cost(prefills=[(256, 256)]).extrapolated


def test_profile_model_flags_and_warns_once_when_it_extrapolates(profile_model):
    with pytest.warns(UserWarning, match="outside the measured grid"):
        assert profile_model.iteration_cost(decodes=[1000]).extrapolated
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert profile_model.iteration_cost(prefills=[(200, 400)]).extrapolated
    assert profile_model.extrapolations == 2


def test_profile_cost_model_from_a_missing_file_says_how_to_make_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="run task=profile"):
        CostModel.for_device("cpu", model="tiny", cost_model="profile", profile=tmp_path / "none.csv")


@pytest.mark.parametrize("column, value", [("seconds", float("nan")), ("seconds", float("inf")), ("seconds", -5.0),
                                           ("tokens", float("nan")), ("context", -1)])
def test_a_profile_row_that_is_no_measurement_fails_with_one_line(column, value):
    # A NaN time reached the virtual clock only when a batch hit that point; inf ran the clock to
    # infinity; a negative time was clipped to zero by the interpolation; a NaN token count dropped
    # the row from the grid without a word.
    table = synthetic_profile()
    row = table.index[(table.op == "ffn") & (table.tokens == 64)][0]
    table.loc[row, column] = value
    with pytest.raises(ValueError, match=rf"^profile table: row {row} \(op 'ffn'\) {column}={value!r} is invalid: "
                                         r"must be a finite number >= 0$"):
        ProfileCostModel(table, PRESETS["tiny"])


def test_memory_arithmetic_refuses_counts_that_are_no_batch():
    # seq_len=-1 gave a batch of -84,069 requests and 0 a ZeroDivisionError; max_tokens=-100000
    # gave the KV cache the memory of activations that cannot exist; a NaN share gave 0 bytes.
    a100, config = load_device("a100"), PRESETS["llama2-7b"]
    for bad in (0, -1, 2.5):
        with pytest.raises(ConfigError, match=rf"^seq_len={bad!r} is invalid: must be an integer >= 1$"):
            max_batch(a100, config, bad)
    with pytest.raises(ConfigError, match=r"^max_tokens=-100000 is invalid: must be an integer >= 0$"):
        kv_capacity_tokens(a100, config, 2, -100000)
    for share in (float("nan"), 0.0, 1.5):
        with pytest.raises(ConfigError, match=rf"^utilisation={share!r} is invalid: must be a number in \(0, 1\]$"):
            kv_capacity_tokens(a100, config, 2, 0, utilisation=share)


@pytest.mark.parametrize("key, value", [("tile_tokens", 0.5), ("attention_tile", 128.5), ("memory_bytes", 1e10 + 0.5)])
def test_device_counts_are_integers(key, value):
    # A tile of 0.5 tokens was taken and padded nothing (attention_tile=0.3 read the context 857
    # times for a 257-token chunk); a fractional byte count is no memory size.
    with pytest.raises(ConfigError, match=rf"^sim.device.a100.{key}={value!r} is invalid: must be an integer > 0$"):
        dataclasses.replace(load_device("a100"), **{key: value})


@pytest.mark.parametrize("kind", ["roofline", "calibrated"])
def test_remembered_small_decode_iterations_are_the_predictions(kind, monkeypatch):
    """The roofline's memo of small decode-only iterations hands out what a fresh prediction gives,
    for each composition apart (the same total context split otherwise is its own entry), and
    starts again when full."""
    from sarathi_lab.sim import roofline

    monkeypatch.setattr(roofline, "MEMO_SIZE", 3)
    cm = CostModel.for_device("a100", "mistral-7b", cost_model=kind)
    for decodes, sampled in [([300], 1), ([100, 200], 2), ([150, 150], 2), ([100, 200], 1), ([300], 1),
                             ([5, 6, 7, 8], 4), ([1] * 5, 5)]:
        got = cm.iteration_cost(decodes=decodes, num_sampled=sampled)
        want = cm._predict([], list(decodes), sampled)
        assert (got.prepare_s, got.forward_s, got.sample_s, got.ops) == \
            (want.prepare_s, want.forward_s, want.sample_s, want.ops)
        assert len(cm._small_decodes) <= 3
    assert cm.iteration_cost(decodes=[300], num_sampled=1) is cm.iteration_cost(decodes=[300], num_sampled=1)
