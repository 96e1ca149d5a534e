"""The measured GPU kernels: converted row for row from vidur's tables, and the cost model that
predicts iterations from them."""
from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd
import pytest

from sarathi_lab.config import ConfigError
from sarathi_lab.measure.sim_check.convert_gpu_kernels import convert_attention, convert_mlp, kept_tokens
from sarathi_lab.model import PRESETS
from sarathi_lab.sim import CostModel
from sarathi_lab.sim import gpu_kernels as gk
from sarathi_lab.sim.interpolate import Surface
from sarathi_lab.sim.kernel_model import KernelCostModel


def _vidur_rows(tokens, tp=1, ms=0.5):
    cols = {}
    for op in ("emb", "attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj", "mlp_act", "attn_rope",
               "input_layernorm", "add"):
        for stat in ("min", "max", "mean", "median", "std"):
            cols[f"time_stats.{op}.{stat}"] = [ms * (2 if stat == "max" else 1)] * len(tokens)
    return pd.DataFrame(cols | {"num_tokens": tokens, "num_tensor_parallel_workers": [tp] * len(tokens),
                                "n_head": 32, "n_kv_head": 32, "n_embd": 4096, "n_expanded_embd": 11008,
                                "vocab_size": 32000, "use_gated_mlp": True})


def test_a_measured_row_in_is_the_same_seconds_out():
    raw = pd.concat([_vidur_rows([1, 64, 2000], ms=0.25), _vidur_rows([64], tp=2, ms=9.0)])
    raw.loc[raw.num_tokens == 64, "time_stats.attn_pre_proj.median"] = [1.5, 9.0]
    out = convert_mlp(raw)
    qkv = out[out.op == "qkv_proj"].set_index("tokens").seconds
    assert qkv[64] == pytest.approx(1.5e-3)  # the median column, TP 1 only, ms -> s
    assert 2000 not in qkv.index  # beyond 1024 only multiples of 64 are kept
    assert "post_attention_norm" not in set(out.op)  # absent in the source: absent here
    assert set(out.op) >= {"embedding", "gate_up_proj", "add"}


def test_attention_rows_convert_to_the_cost_models_terms():
    raw = pd.DataFrame({"kind": ["prefill", "decode"], "batch_size": [1, 8], "prefill_chunk_size": [512, 0],
                        "kv_cache_size": [1024, 1024], "median_ms": [0.2, 0.1]})
    out = convert_attention(raw).set_index("op")
    assert tuple(out.loc["prefill_attention", ["tokens", "context", "batch"]]) == (512, 1536, 1)
    assert tuple(out.loc["decode_attention", ["tokens", "context", "batch"]]) == (8, 1025, 8)
    assert out.loc["prefill_attention", "seconds"] == pytest.approx(2e-4)


def test_shipped_tables_hold_vidurs_medians():
    # vidur's a100 Llama-2-7B mlp.csv, TP1, 4096 tokens: attn_pre_proj median 1.911 ms (first row).
    t = gk.kernels("a100", "llama2-7b")
    row = t[(t.op == "qkv_proj") & (t.tokens == 4096)]
    assert row.seconds.iloc[0] == pytest.approx(1.9e-3, rel=0.02)
    assert kept_tokens(1024) and kept_tokens(1088) and not kept_tokens(1090)
    assert gk.model_of(PRESETS["llama2-7b"]) == "llama2-7b"
    assert {"a100", "h100", "a40"} <= set(gk.measured_devices())


def test_a_ragged_surface_interpolates_inside_and_says_where_it_extrapolates():
    s = Surface({(1, 10): 1.0, (1, 20): 2.0, (3, 10): 3.0, (3, 30): 5.0})
    assert s(1, 15) == pytest.approx((1.5, False))
    assert s(2, 10) == pytest.approx((2.0, False))
    assert s(3, 25) == pytest.approx((4.5, False))  # on row 3, inside its points, though row 1 stops at 20
    assert s(2, 25)[1]  # between rows, and row 1 stops at 20: carried on along its last segment
    assert s(4, 10)[1] and s(0, 10)[1]


def _measured(device="a100", model="llama2-7b") -> KernelCostModel:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cm = CostModel.for_device(device, model, "profile")
    assert any("modelled by sim_cost_model=" in str(w.message) for w in caught)  # the run says what is modelled
    return cm


def test_profile_on_a_gpu_predicts_from_the_measured_kernels():
    cm = _measured()
    assert isinstance(cm, KernelCostModel)
    t = gk.kernels("a100", "llama2-7b")
    per_layer = t[t.tokens == 256].set_index("op").seconds
    cost = cm.iteration_cost(prefills=[(256, 256)], num_sampled=0)
    # Within the noise the monotone fit smooths away (measured times never fall with more tokens).
    assert cost.ops["qkv_proj"] == pytest.approx(32 * per_layer["qkv_proj"], rel=0.1)
    pre = t[(t.op == "prefill_attention") & (t.tokens == 288) & (t.context == 288 + 64)].seconds.iloc[0]
    assert cm.iteration_cost(prefills=[(288, 352)]).ops["prefill_attention"] == pytest.approx(32 * pre, rel=0.05)
    before = cm.modelled_attention_iterations
    cm.iteration_cost(prefills=[(288, 352)])
    assert cm.modelled_attention_iterations == before
    cm.iteration_cost(prefills=[(4000, 8000)])  # no measured chunk that long: the roofline's
    assert cm.modelled_attention_iterations == before + 1


def test_measured_models_without_presets_and_refusals():
    assert _measured("h100", "llama2-70b").iteration_time_s(decodes=[100] * 4) > 0
    with pytest.raises(ConfigError, match="sim_cost_model='profile' is invalid"):
        CostModel.for_device("h200", PRESETS["llama2-7b"], "profile", tp=2)
    # Neither measured kernels nor an engine profile: the profile's own refusal.
    with pytest.raises(FileNotFoundError, match="run task=profile"):
        CostModel.for_device("h200", "llama2-7b", "profile")


def test_the_engines_own_gpu_profile_comes_before_other_engines_kernels(tmp_path, monkeypatch):
    from sarathi_lab.sim.profile_model import ProfileCostModel

    monkeypatch.setenv("SARATHI_PROFILES_DIR", str(tmp_path))
    (tmp_path / "a100").mkdir()
    # Any engine profile stands in for one the lent GPU measured (the repository ships the CPU's).
    source = Path(__file__).resolve().parents[1] / "profiles" / "cpu" / "cpu-small.csv"
    (tmp_path / "a100" / "llama2-7b.csv").write_text(source.read_text())
    assert isinstance(CostModel.for_device("a100", "llama2-7b", "profile"), ProfileCostModel)
