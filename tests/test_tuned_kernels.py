"""The per-device tuned-kernel table (sarathi_lab/tuned_kernels.py) and the engine's use of it: a device
without a table runs today's defaults, a table's entries are picked up by the Triton attention (tile
config per work kind) and by the projections (the Triton split-K GEMM, gate_up with SiLU * up fused),
and the suite's ``tune`` step writes a table the engine reads back."""
from __future__ import annotations

import json
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from transformers.activations import ACT2FN

from sarathi_lab import tuned_kernels
from sarathi_lab.attention import triton_backend
from sarathi_lab.attention.triton_backend import TritonAttention
from sarathi_lab.model.layers import tuned_linear
from sarathi_lab.tuned_kernels import (
    DEFAULT,
    GemmChoice,
    TileConfig,
    TunedTable,
    file_name,
    gemm_key,
    load,
    table_for,
    table_named,
    using,
)
from tests.test_kernels import expected, make_inputs

PREFILL = TileConfig(block_m=32, block_n=16, num_warps=2, num_stages=2)
DECODE = TileConfig(block_m=16, block_n=32, num_warps=1, num_stages=1)
SPLIT = GemmChoice("triton", 16, 16, 16, 2, 2, 2)


def a_table(n: int = 24, k: int = 40) -> TunedTable:
    return TunedTable("NVIDIA H100 80GB HBM3", {"prefill": PREFILL, "decode": DECODE},
                      {gemm_key(n, k, False): {8: SPLIT, 64: GemmChoice()},
                       gemm_key(2 * n, k, True): {1: GemmChoice("triton", 16, 32, 16, 1, 2, 2)}})


def test_a_device_without_a_table_runs_the_defaults(tmp_path):
    assert table_for(torch.device("cpu")) is DEFAULT
    assert table_named("No Such GPU", tmp_path) is DEFAULT
    assert DEFAULT.tiles("prefill").launch_kwargs() == {} and DEFAULT.tiles("decode").launch_kwargs() == {}
    assert DEFAULT.gemm_for(5120, 5120, 256).kernel == "cublas"
    x, layer = torch.randn(3, 8), nn.Linear(8, 4, bias=False)
    assert tuned_linear(x, layer) is None  # the caller's own linear: cuBLAS on CUDA, the CPU path here


def test_a_table_is_found_by_the_device_name_and_reads_back(tmp_path, monkeypatch):
    table = a_table()
    (tmp_path / file_name(table.device)).write_text(json.dumps(table.to_json()))
    assert file_name(table.device) == "NVIDIA_H100_80GB_HBM3.json"
    monkeypatch.setattr(tuned_kernels, "TABLE_DIR", tmp_path)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: table.device)
    tuned_kernels._cuda_table.cache_clear()
    try:
        read = table_for(torch.device("cuda", 0))
    finally:
        tuned_kernels._cuda_table.cache_clear()
    assert read.attention == table.attention and read.gemm == table.gemm
    # The nearest tuned token count at or below the batch's; the smallest below them all; cuBLAS off the table.
    assert read.gemm_for(24, 40, 8) == SPLIT and read.gemm_for(24, 40, 63) == SPLIT
    assert read.gemm_for(24, 40, 1000).kernel == "cublas" and read.gemm_for(24, 40, 2) == SPLIT
    assert read.gemm_for(24, 41, 8).kernel == "cublas"


def test_a_bad_table_entry_fails_in_one_line_naming_it(tmp_path):
    path = tmp_path / "GPU.json"
    path.write_text(json.dumps({"attention": {"prefill": {"block_m": 0}}}))
    with pytest.raises(ValueError, match=r"^error: .*GPU.json: attention.prefill.block_m=0 is invalid; allowed: a "
                                         r"power of two in \[16, 256\] or null$"):
        load(path)
    path.write_text(json.dumps({"gemm": {"8x8": {"16": {"kernel": "cutlass"}}}}))
    with pytest.raises(ValueError, match=r"gemm.8x8.16.kernel='cutlass' is invalid; allowed: cublas, triton$"):
        load(path)
    path.write_text(json.dumps({"attention": {"mixed": {}}}))
    with pytest.raises(ValueError, match=r"attention.mixed=\{\} is invalid; allowed: prefill, decode$"):
        load(path)


@pytest.mark.parametrize("decode", [False, True])
def test_triton_attention_takes_the_tiles_of_the_batch_s_work_kind(monkeypatch, decode):
    torch.manual_seed(0)
    prefills = [] if decode else [(5, 37)]
    query, k_cache, v_cache, meta = make_inputs(prefills, [(1, 20), (1, 33)], heads=4, kv_heads=2, head_dim=16,
                                                block_size=16, dtype=torch.float32)
    backend = TritonAttention()  # imports the kernels (a backend loads them when first made)
    seen, attend = [], triton_backend.paged_attention

    def spy(*args, **kwargs):
        plan = kwargs["plan"]
        launch = plan.decode if decode else plan.prefill
        seen.append({k: getattr(launch.tiles, k) for k in ("block_m", "block_n", "num_warps", "num_stages")})
        return attend(*args, **kwargs)

    monkeypatch.setattr(triton_backend, "paged_attention", spy)
    default = backend.attend(query, k_cache, v_cache, meta, 16**-0.5)
    meta.plan = None  # planned again, under the table
    with using(a_table()):
        tuned = backend.attend(query, k_cache, v_cache, meta, 16**-0.5)
    want = DECODE if decode else PREFILL
    assert seen[0] != seen[1]
    assert seen[1] == {k: getattr(want, k) for k in seen[0]}
    ref = expected(query, k_cache, v_cache, meta)
    torch.testing.assert_close(tuned, ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(default, ref, rtol=1e-4, atol=1e-4)


def test_a_projection_takes_the_tuned_triton_gemm_and_gate_up_its_fused_activation():
    torch.manual_seed(0)
    layer, gate_up = nn.Linear(40, 24, bias=False), nn.Linear(40, 48, bias=False)
    x = torch.randn(9, 40)
    with torch.no_grad(), using(a_table()):
        out = tuned_linear(x, layer)  # 9 tokens: the entry at 8, split-K
        fused = tuned_linear(x, gate_up, gated=True)
        plain = tuned_linear(x[:1].repeat(64, 1), layer)  # 64 tokens: cuBLAS, the caller's own
    assert plain is None
    torch.testing.assert_close(out, layer(x).detach())
    product = gate_up(x).detach()
    torch.testing.assert_close(fused, ACT2FN["silu"](product[:, :24]) * product[:, 24:])


def test_the_tune_step_writes_a_table_the_engine_reads(tmp_path):
    from sarathi_lab.measure.gpu.context import Context
    from sarathi_lab.measure.gpu.plan import BY_NAME
    from sarathi_lab.measure.gpu.steps import tune

    metrics, notes = tune.run(Context(tmp_path, tmp_path, True, "cpu", None), BY_NAME["tune"])
    by_name = {m.metric: m.value for m in metrics}
    table = load(tmp_path / by_name["tuned_table"])
    assert set(table.attention) == {"prefill", "decode"}
    assert {f"attention_tiles[{k}]" for k in ("prefill", "decode")} <= set(by_name)
    keys = {gemm_key(512, 256, False), gemm_key(256, 256, False), gemm_key(1376, 256, True), gemm_key(256, 688, False)}
    assert set(table.gemm) == keys and all(set(by_m) == {16} for by_m in table.gemm.values())
    for key in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
        choice = by_name[f"gemm_choice[tiny.{key},m=16]"]
        assert choice == "cublas" or choice.startswith("triton")
    assert (tmp_path / "tune_attention.csv").is_file() and (tmp_path / "tune_gemm.csv").is_file()
    assert "times say nothing" in notes[0]
    assert {"split_rule", "split_rule_fitted_over_default"} <= set(by_name)


@pytest.mark.e2e
def test_the_engine_s_greedy_tokens_are_the_same_through_a_table_s_triton_gemms_and_tiles(monkeypatch):
    # Every projection of the tiny model through the Triton GEMM (gate_up with its fused SiLU * up, the
    # down projection split), and tuned tiles, against the same engine on the defaults.
    from sarathi_kernels import gemm as gemm_module

    from sarathi_lab import LLM
    from sarathi_lab.measure.profiling.gemm_sweep import projections
    from sarathi_lab.model.presets import PRESETS
    from sarathi_lab.model.shape import Shape

    shape = Shape.of(PRESETS["tiny"])
    choice = {p.key: {1: GemmChoice("triton", 16, 64, 32, 2 if p.name == "down_proj" else 1, 4, 2)}
              for p in projections(shape)}
    table = TunedTable("tiny", {"prefill": TileConfig(32, 32, 4, 2), "decode": TileConfig(16, 32, 2, 2)}, choice)
    prompts = [[7 * i % 4096 for i in range(n)] for n in (20, 6)]
    llm = LLM(model="tiny", attention="triton", device="cpu", dtype="float32", cpu_linear="aten", chunk_size=16,
              max_batch_size=2, warmup_iters=0)
    default = llm.generate(prompts, max_new_tokens=2)
    calls, real = [], gemm_module.gemm
    monkeypatch.setattr(gemm_module, "gemm", lambda *a, **kw: calls.append(kw.get("gated", False)) or real(*a, **kw))
    with using(table):
        tuned = llm.generate(prompts, max_new_tokens=2)
    assert tuned == default
    assert calls.count(True) == calls.count(False) / 3 > 0  # per layer: qkv, o_proj, down plain; gate_up gated


def test_a_table_s_split_rule_reads_back_with_only_the_knobs_it_moved(tmp_path):
    from sarathi_kernels.split_rule import DEFAULT_RULE, SplitRule

    rule = SplitRule(min_key_tiles=2, split_cost_tiles=0.5)
    table = TunedTable("GPU", split_rule=rule.moved_knobs())
    assert table.to_json()["split_rule"] == {"min_key_tiles": 2, "split_cost_tiles": 0.5}
    assert "split_rule" not in a_table().to_json() and DEFAULT_RULE.moved_knobs() == {}
    path = tmp_path / "GPU.json"
    path.write_text(json.dumps(table.to_json()))
    assert SplitRule.with_knobs(load(path).split_rule) == rule
    path.write_text(json.dumps({"split_rule": {"max_waves": "two"}}))
    with pytest.raises(ValueError, match=r"^error: .*GPU.json: split_rule.max_waves='two' is invalid; allowed: a "
                                         r"number in \[0, 1e\+06\]$"):
        load(path)


@pytest.mark.parametrize(("knobs", "message"), [
    ({"min_key_tiles": 2.5}, r"split_rule.min_key_tiles=2.5 is invalid: must be an integer$"),
    ({"max_waves": 0}, r"split_rule.max_waves=0 is invalid: must be >= 1$"),
    ({"split_cost": 1}, (r"split_rule.split_cost=1 is invalid; allowed: max_splits, max_waves, min_gain, "
                         r"min_key_tiles, split_cost_tiles$"))])
def test_a_bad_split_rule_knob_is_named_in_one_line_and_the_default_rule_runs(knobs, message, caplog):
    from sarathi_kernels.split_rule import DEFAULT_RULE

    _, k_cache, _, meta = make_inputs([], [(1, 64)], heads=2, kv_heads=2, head_dim=16, block_size=16,
                                      dtype=torch.float32)
    source = f"/tables/GPU-{'-'.join(knobs)}.json"
    with using(TunedTable("GPU", source=source, split_rule=knobs)):
        assert TritonAttention()._rule(k_cache) == DEFAULT_RULE
        TritonAttention().batch_plan(meta, 2, k_cache)
    [line] = [r.getMessage() for r in caplog.records if source in r.getMessage()]  # once, however often planned
    assert line.startswith(f"error: {source}: ") and re.search(message.removesuffix("$"), line)
    assert line.endswith("; running split_rule's default rule")


def test_triton_attention_plans_its_splits_by_the_table_s_rule():
    from sarathi_kernels.occupancy import GpuLimits

    # One decode of 640 keys (20 key tiles) on 8 SMs: the default's split cost of a key tile cuts its
    # walks in pieces; the table's 30 (more than a walk) leaves them whole.
    _, k_cache, _, meta = make_inputs([], [(1, 640)], heads=2, kv_heads=2, head_dim=16, block_size=16,
                                      dtype=torch.float32)
    backend = TritonAttention(limits=GpuLimits(num_sms=8))
    default = backend.batch_plan(meta, 2, k_cache).decode.balanced.split_capacity
    meta.plan = None
    with using(TunedTable("GPU", split_rule={"split_cost_tiles": 30})):
        tuned = backend.batch_plan(meta, 2, k_cache).decode.balanced.split_capacity
    assert tuned == 1 < default


def test_the_split_rule_fit_keeps_the_default_unless_another_rule_loses_clearly_less():
    from sarathi_kernels.split_rule import DEFAULT_RULE

    from sarathi_lab.measure.profiling.attention_sweep import RULE_GRID, fit_split_rule, rule_label

    def rows(times: dict[int, float], planned: dict[str, int]) -> list[dict]:
        by_rule = json.dumps({rule_label(r): planned.get(rule_label(r), 8) for r in RULE_GRID})
        return [{"kind": "decode", "shape": "s", "splits": str(n), "ms": ms, "rule_splits": by_rule}
                for n, ms in times.items()]

    assert fit_split_rule([]) == (DEFAULT_RULE, 1.0)
    # The default plans 8, timed fastest: it stays.
    assert fit_split_rule(rows({4: 1.2, 8: 1.0, 16: 1.3}, {}))[0] == DEFAULT_RULE
    # 16 is fastest, and only k2_c0.5 plans it: it wins by 1.3x.
    rule, gain = fit_split_rule(rows({4: 1.4, 8: 1.3, 16: 1.0}, {"k2_c0.5": 16}))
    assert rule_label(rule) == "k2_c0.5" and gain == pytest.approx(1.3)
    # Within the noise margin, the default.
    assert fit_split_rule(rows({4: 1.4, 8: 1.01, 16: 1.0}, {"k2_c0.5": 16}))[0] == DEFAULT_RULE
    # Between counts timed, the time is interpolated in log2(count): 12 is half way from 8 (1.3) to 16 (1.0).
    rule, gain = fit_split_rule(rows({4: 1.4, 8: 1.3, 16: 1.0}, {"k2_c1": 11, "k2_c0.5": 12}))
    assert rule_label(rule) == "k2_c0.5" and gain == pytest.approx(1.3 / (1.3 - 0.3 * 0.5849625), rel=1e-6)


def test_every_committed_table_is_found_for_its_device_and_the_defaults_elsewhere(monkeypatch):
    # The tune step's tables are committed under sarathi_lab/tuned/ by the name the lookup forms: each is
    # the one a CUDA device of its name reads, whole and as written; any other device runs the defaults.
    committed = sorted(tuned_kernels.TABLE_DIR.glob("*.json"))
    assert "NVIDIA_H100_80GB_HBM3.json" in {p.name for p in committed}
    for path in committed:
        table = load(path)
        assert file_name(table.device) == path.name
        assert table_named(table.device) == table and table.attention, path
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None, name=table.device: name)
        tuned_kernels._cuda_table.cache_clear()
        try:
            assert table_for(torch.device("cuda", 0)) == table
        finally:
            tuned_kernels._cuda_table.cache_clear()
        with using(table):  # what the engine's attention launches on that device
            tiles = TritonAttention()._tiles(torch.empty(1, 1, 16, 8, dtype=torch.bfloat16))
        assert tiles.decode.block_n == table.tiles("decode").block_n
    assert table_named("NVIDIA A100-SXM4-80GB") is DEFAULT and table_for(torch.device("cpu")) is DEFAULT


BAD_TABLES = {
    "a list": ([1, 2], r"the table=\[1, 2\] is invalid; allowed: a mapping"),
    "another device": ({"device": "NVIDIA A100"}, r"device='NVIDIA A100' is invalid; allowed: 'GPU'"),
    "a bool tile": ({"device": "GPU", "attention": {"decode": {"num_warps": True}}},
                    r"attention.decode.num_warps=True is invalid; allowed: one of 1, 2, 4, 8, 16 or null"),
    "a huge split": ({"device": "GPU", "gemm": {"8x8": {"16": {"kernel": "triton", "split_k": 10**30}}}},
                     r"gemm.8x8.16.split_k=\d+ is invalid; allowed: an integer in \[1, 64\]"),
    "an infinite cost": ({"device": "GPU", "split_rule": {"split_cost_tiles": float("inf")}},
                         r"split_rule.split_cost_tiles=inf is invalid; allowed: a number in \[0, 1e\+06\]"),
    "a newer key": ({"device": "GPU", "fused": {}}, r"fused=\{\} is invalid; allowed: device, attention, gemm"),
    "no JSON": ("{", r"not a JSON table \(JSONDecodeError\)"),
}


@pytest.mark.parametrize("case", sorted(BAD_TABLES))
def test_a_bad_table_is_named_in_one_line_and_the_engine_runs_the_defaults(case, tmp_path, caplog):
    raw, message = BAD_TABLES[case]
    path = tmp_path / "GPU.json"
    path.write_text(raw if isinstance(raw, str) else json.dumps(raw))
    with pytest.raises(tuned_kernels.TableRefused, match=f"^error: {re.escape(str(path))}: {message}"):
        load(path, "GPU")
    assert table_named("GPU", tmp_path) is DEFAULT
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"error: {path}: ") and line.endswith("; running the kernels' defaults")


def test_collect_refuses_a_lease_whose_tuned_table_breaks_the_schema_before_writing(tmp_path):
    from sarathi_lab.measure.gpu import state
    from sarathi_lab.measure.gpu.collect import collect

    out, gpu = tmp_path / "out", "NVIDIA H100 80GB HBM3"
    files = {"steps/env/env.json": {"device": gpu},
             "summary.json": {"steps": [{"step": "env", "started_at": 1795716475.6, "commit": "27958ff",
                                         "status": "done"}]},
             f"steps/tune/{file_name(gpu)}": {"device": gpu, "attention": {"decode": {"block_n": 1e30}}}}
    for name, record in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(json.dumps(record))
    state.archive(out, tmp_path / "suite.tar.gz")
    with pytest.raises(ValueError, match=r"steps/tune/NVIDIA_H100_80GB_HBM3.json: attention.decode.block_n=1e\+30 "
                                         r"is invalid; allowed: a power of two in \[16, 256\] or null$"):
        collect(tmp_path / "suite.tar.gz", tmp_path / "repo")
    assert not (tmp_path / "repo").exists()
    (out / f"steps/tune/{file_name(gpu)}").write_text(json.dumps(load(tuned_kernels.TABLE_DIR / file_name(gpu))
                                                                  .to_json()))
    state.archive(out, tmp_path / "suite.tar.gz")
    assert any(p.name == file_name(gpu) for p in collect(tmp_path / "suite.tar.gz", tmp_path / "repo"))


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                  max_size=3), max_leaves=8)
_FIELDS = [("device",), ("attention",), ("attention", "decode"), ("attention", "prefill", "block_m"),
           ("attention", "decode", "num_stages"), ("gemm",), ("gemm", "8x8"), ("gemm", "8x8", "16"),
           ("gemm", "8x8", "16", "kernel"), ("gemm", "8x8", "16", "split_k"), ("split_rule",),
           ("split_rule", "max_waves"), ("split_rule", "split_cost_tiles")]


@settings(max_examples=300, deadline=None)
@given(where=st.sampled_from(_FIELDS), value=_JSON, top=st.booleans())
def test_any_json_value_in_any_field_never_raises_out_of_the_loader(where, value, top):
    raw = a_table().to_json() | {"device": "GPU", "split_rule": {"max_waves": 2, "split_cost_tiles": 1.0}}
    if top:
        raw = value  # the whole table
    else:
        node = raw
        for key in where[:-1]:
            node = node.setdefault(key, {})
        node[where[-1]] = value
    source = "GPU.json"
    try:
        table = tuned_kernels.parse(raw, source, "GPU")
    except tuned_kernels.TableRefused as e:
        assert str(e).startswith(f"error: {source}: ") and "\n" not in str(e)
        return
    # What it accepted, the engine can use: tiles and GEMM choices in their ranges, the rule buildable or
    # refused in one line (the backend then runs the default rule).
    from sarathi_kernels.split_rule import SplitRule

    for choices in table.gemm.values():
        for choice in choices.values():
            assert choice.kernel in tuned_kernels.GEMM_KERNELS and 1 <= choice.split_k <= 64
    try:
        SplitRule.with_knobs(table.split_rule)
    except ValueError as e:
        assert "\n" not in str(e)
