"""Floors a reader can use (elementwise bytes, the graph's padded tokens, the memory ceiling, the library
floor), ``analysis.attribute`` on a synthetic lease and on the committed H100 one, and the paper's
device beside ours (``analysis.device_beside``)."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sarathi_lab.analysis import attribute, gpu_claims
from sarathi_lab.analysis import library_floor as lib
from sarathi_lab.measure.bench import device_beside
from sarathi_lab.model import load_config
from sarathi_lab.model.cuda_graphs import token_buckets
from sarathi_lab.model.floors import memory_ceiling
from sarathi_lab.model.shape import Shape

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "docs" / "gpu" / "h100" / "2026-11-27_7fae342"


def test_elementwise_bytes_count_the_engine_s_fused_passes():
    # LLaMA-13B bf16, by hand: two add-RMSNorms read x and residual and write both (8 x 5120 x 2 B);
    # RoPE + KV write reads q, k, v and writes q, k, v (6 x 5120 x 2 B); SiLU x up reads 2 x 13824 and
    # writes 13824 (3 x 13824 x 2 B): 226,304 bytes a token and layer.
    parts = Shape.of(load_config("llama-13b")).elementwise_bytes_per_token(2)
    assert parts == {"norms": 81920, "rope_kv_write": 61440, "activation": 82944}
    assert sum(parts.values()) == 226_304


def test_padded_tokens_are_the_engine_s_buckets():
    assert lib.padded_tokens(273, 529, 18) == 384 and lib.padded_tokens(529, 529, 18) == 640  # tile multiples
    assert lib.padded_tokens(256, 529, 18) == 256 and lib.padded_tokens(18, 529, 18, decode_only=True) == 18
    assert lib.padded_tokens(2000, 529, 18) == 2000  # no graph holds it: eager, unpadded


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 1024), st.integers(1, 1024))
def test_a_padded_count_is_the_smallest_bucket_that_holds_the_tokens(tokens, largest):
    padded = lib.padded_tokens(tokens, largest, 18)
    buckets = token_buckets(largest)
    assert padded >= tokens
    assert padded == tokens if tokens > buckets[-1] else padded == min(b for b in buckets if b >= tokens)


def test_memory_ceiling_is_the_read_rate_where_measured_else_the_copy_rate():
    assert memory_ceiling({"copy_gbps": 2890.0, "read_gbps": 3080.0}) == (3080.0, "read")
    assert memory_ceiling({"copy_gbps": 2890.0}) == (2890.0, "copy")
    with pytest.raises(ValueError, match="read_gbps=None, copy_gbps=-1"):
        memory_ceiling({"copy_gbps": -1})


def test_interpolation_stays_inside_what_was_measured():
    points = {128: 1.0, 256: 3.0}
    assert lib.interpolate(points, 192) == 2.0 and lib.interpolate(points, 128) == 1.0
    assert lib.interpolate(points, 64) is None and lib.interpolate(points, 512) is None


def _write_csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def lease_record(folder: Path) -> dict:
    """lease.json as gpu.collect writes it, for a lease in ``folder`` (<device>/<date>_<commit>)."""
    return {"device": folder.parent.name, "machine": "NVIDIA H100 80GB HBM3", "lease": folder.name,
            "commit": folder.name.split("_", 1)[1], "steps_done": ["env", "launch"], "steps_not_done": {},
            "engine": "decode and mixed CUDA graphs", "profiles": []}


def step_record(step: str, metrics: list[dict]) -> dict:
    """A step's result.json as the suite writes it."""
    return {"step": step, "status": "done", "started_at": 1.79e9, "seconds": 1.0, "metrics": metrics}


def synthetic_lease(folder: Path, tune: bool = True) -> Path:
    """A lease of two launch iterations with tables that cover one of them, and one claim."""
    (folder / "steps" / "env").mkdir(parents=True)
    (folder / "steps" / "launch").mkdir(parents=True)
    (folder / "lease.json").write_text(json.dumps(lease_record(folder)))
    (folder / "steps" / "env" / "env.json").write_text(json.dumps({"copy_gbps": 3000.0, "matmul_tflops": 800.0}))
    metrics = []
    for key, ms in (("c=256+b=17", 22.0), ("b=18", 15.0)):
        metrics += [{"metric": f"engine_ms[{key}]", "value": ms},
                    {"metric": f"engine_graph_tokens[{key}]", "value": 288 if "c=" in key else 18},
                    {"metric": f"engine_over_floor[{key}]", "value": 1.5, "target": "<= 1.25"}]
    (folder / "steps" / "launch" / "result.json").write_text(json.dumps(step_record("launch", metrics)))
    if tune:
        _write_csv(folder / "steps" / "tune" / "tune_gemm.csv",
                   [{"projection": p, "key": "k" + ("+silu_mul" if p == "gate_up_proj" else ""), "m": m,
                     "candidate": "cublas", "rel_diff": 0, "error": "", "ms": 0.08, "model": "llama-13b"}
                    for p in lib.PROJECTIONS for m in (128, 256, 512)])
    _write_csv(folder / "steps" / "attention" / "attention.csv",
               [{"kind": kind, "heads": 40, "kv_heads": 40, "batch": batch, "query_len": q, "context": ctx,
                 "engine_ms": ms, "best_peer_ms": ms * 0.8}
                for kind, batch, q, ctx, ms in (("chunk", 1, 256, 256, 0.02), ("chunk", 1, 256, 1280, 0.06),
                                                ("decode", 1, 1, 1024, 0.03), ("decode", 18, 1, 1024, 0.15))])
    _write_csv(folder / "claims.csv", [{"experiment": "chunk_overhead", "claim": "Chunks of 256 keep it",
                                        "paper": "<= 1.20x", "ours": "chunk 256: 1.60x prefill at length 3072",
                                        "holds": "no"}])
    return folder


def test_attribution_of_a_synthetic_lease_sums_to_the_time_over_the_floor(tmp_path):
    found, _, _ = attribute.rows(synthetic_lease(tmp_path / "h100" / "2026-11-01_abc1234"))
    hybrid, decode = (r for r in found if r["kind"] == "iteration")
    assert (hybrid["tokens"], hybrid["graph_tokens"]) == (273, 288)
    for row in (hybrid, decode):
        assert sum(row[p] for p in attribute.PARTS if row[p] is not None) == pytest.approx(row["over_floor_ms"])
        assert row["host_ms"] is None and "host: not in the lease" in row["note"]
    assert hybrid["gemm_efficiency_ms"] is not None and hybrid["padding_ms"] > 0
    assert decode["gemm_efficiency_ms"] is None and "cuBLAS at 18 tokens" in decode["note"]
    # cuBLAS twice as fast a token at 512 as at 256 here: the device explains 2.0x of the chunk's 1.60x.
    claim = next(r for r in found if r["kind"] == "claim")
    assert "chunk 256: 2.00x of 1.60x is cuBLAS at 256 vs 512 tokens on the H100; -0.40x" in claim["why"]
    assert "out of reach" in hybrid["targets"]


@pytest.mark.parametrize("ours, says", [("1.7x-6.4x", "so the shortfall at the top is our engine"),
                                        ("2.2x-440.3x", "ours' top lies above the floors'")])
def test_the_decode_gain_is_set_beside_the_device_s_floors(tmp_path, ours, says):
    folder = synthetic_lease(tmp_path / "h100" / "2026-11-01_abc1234")
    _write_csv(folder / "claims.csv", [{"experiment": "decode_speedup", "claim": "gain", "holds": "partly",
                                        "paper": "2.8x-10x (13B/A6000, chunk 256)",
                                        "ours": f"tile-aligned: {ours} over batch sizes 2, 18 and lengths 1024"}])
    claim = next(r for r in attribute.rows(folder)[0] if r["kind"] == "claim")
    # At the floors a decode costs its KV read beside a memory-bound chunk: B=2 gains most, B=18 least.
    assert claim["why"].startswith("the H100's physical floors allow ") and "(B=18, length 1024) to " in claim["why"]
    assert says in claim["why"]


def test_a_lease_without_tune_says_its_gemm_part_is_missing_and_the_cli_writes_both_files(tmp_path, capsys):
    folder = synthetic_lease(tmp_path / "h100" / "2026-11-01_abc1234", tune=False)
    assert attribute.main([str(folder)]) == 0
    table, page = (tmp_path / "h100" / f"2026-11-01_abc1234.attribution{s}" for s in (".csv", ".md"))
    with open(table, newline="") as f:
        rows = list(csv.DictReader(f))
    assert all(r["gemm_efficiency_ms"] == "" for r in rows if r["kind"] == "iteration")
    assert "not attributed (tune_gemm.csv timed no tokens)" in rows[-1]["why"]
    assert "| c=256+b=17 | 273 (288) |" in page.read_text()
    assert "wrote" in capsys.readouterr().out


def test_attribution_is_written_beside_the_lease_and_leaves_its_collected_files_as_they_were(tmp_path):
    folder = synthetic_lease(tmp_path / "h100" / "2026-11-01_abc1234")
    (folder / "provenance.json").write_text('{"*": {"source": "measured GPU"}}\n')
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert attribute.main([str(folder)]) == 0
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before
    sidecar = json.loads((tmp_path / "h100" / "provenance.json").read_text())
    assert sidecar["2026-11-01_abc1234.attribution.md"]["lease"] == "2026-11-01_abc1234"
    # What another writer left there is replaced only when asked.
    (tmp_path / "h100" / "provenance.json").unlink()
    with pytest.raises(SystemExit):
        attribute.main([str(folder)])
    assert attribute.main([str(folder), "--force"]) == 0


def test_a_lease_folder_with_an_unreadable_launch_result_is_refused_in_one_line(tmp_path):
    folder = synthetic_lease(tmp_path / "h100" / "2026-11-01_abc1234")
    (folder / "steps" / "launch" / "result.json").write_text("[1, 2")
    with pytest.raises(ValueError, match=r"steps/launch/result.json is invalid"):
        attribute.load(folder)


def test_a_lease_that_ran_no_launch_step_still_attributes_its_claims(tmp_path):
    folder = synthetic_lease(tmp_path / "h200" / "2026-11-01_abc1234")
    (folder / "steps" / "launch" / "result.json").unlink()
    (folder / "steps" / "launch").rmdir()
    found, t, lease = attribute.rows(folder)
    assert [r["kind"] for r in found] == ["claim"] and "is cuBLAS at 256" in found[0]["why"]
    assert "or the lease ran no launch step" in attribute.markdown(found, t, lease)


def test_the_h100_lease_end_to_end():
    # The committed lease: its parts sum to each iteration's time over the floor, the floors recomputed
    # at its copy rate are the launch step's, and the attribution table beside it is what the module writes now.
    found, t, lease = attribute.rows(H100)
    iterations = [r for r in found if r["kind"] == "iteration"]
    assert len(iterations) == 30 and t.ceiling == "copy"
    for row in iterations:
        parts = sum(row[p] for p in attribute.PARTS if row[p] is not None)
        assert parts == pytest.approx(row["over_floor_ms"], abs=1e-9)
        assert row["floor_ms"] == pytest.approx(attribute._value(lease, f"floor_ms[{row['name']}]"), abs=2e-3)
    assert {r["name"]: r["graph_tokens"] for r in iterations}["c=512+b=17"] == 544
    why = next(r["why"] for r in found if r.get("experiment") == "chunk_overhead")
    assert "chunk 256: 1.45x of 1.50x is cuBLAS at 256 vs 1,024 tokens on the H100" in why
    with open(H100.parent / f"{H100.name}.attribution.csv", newline="") as f:
        kept = list(csv.DictReader(f))
    assert [r["name"] for r in kept] == [r["name"] for r in found]


def test_gpu_claims_show_the_lease_s_why_and_say_when_a_lease_has_none(tmp_path):
    from tests.test_gpu_claims import keep_run
    gpu = tmp_path / "gpu"
    keep_run(gpu, "h100", "2026-11-27_aaaaaaa", {"gain": "2x"})
    keep_run(gpu, "h200", "2026-11-27_bbbbbbb", {"gain": "3x"})
    for device, run in (("h100", "2026-11-27_aaaaaaa"), ("h200", "2026-11-27_bbbbbbb")):
        claims = gpu / device / run / "claims.csv"
        text = claims.read_text().replace(",yes", ",no")
        claims.write_text(text)
    _write_csv(gpu / "h100" / "2026-11-27_aaaaaaa.attribution.csv",
               [{"kind": "claim", "experiment": "decode_speedup", "claim": "gain", "why": "the device's floors"}])
    whys = {r.device: r.why for r in gpu_claims.judged(gpu)}
    assert whys == {"h100": "the device's floors", "h200": "not attributed (no attribution beside the lease)"}
    # A claim no reader knows keeps its recorded verdict, not re-judged.
    assert "| not re-judged (recorded: no) | the device's floors |" in gpu_claims.section(gpu)


def test_ridge_points_and_the_simulated_chunking_claim():
    # The A6000's data sheet: 154.8 dense bf16 TFLOP/s over 768 GB/s, 2-byte weights: 202 tokens.
    assert device_beside.ridge_tokens(154.8e12, 768e9) == pytest.approx(201.6, abs=0.1)
    # A chunk as long as the prompt is no chunking; smaller chunks cost the simulated engine more.
    whole = device_beside.simulated_prefill_ratio("a6000", "roofline", 256, 256, model="tiny")
    assert whole == pytest.approx(1.0)
    assert device_beside.simulated_prefill_ratio("a6000", "roofline", 16, 256, model="tiny") > 1.0


def test_device_beside_writes_its_page_with_every_device_and_the_measured_ceilings(tmp_path, monkeypatch):
    monkeypatch.setattr(device_beside, "sim_rows", lambda: [
        {"device": d, "cost_model": c, "chunk": k, "length": n, "prefill_ratio": 1.3 if d == "h100" else 1.0}
        for d in device_beside.SIMULATED for c in device_beside.COST_MODELS for k in device_beside.CHUNKS
        for n in device_beside.LENGTHS])
    assert device_beside.main(["--gpu-docs", str(ROOT / "docs" / "gpu"), "--out", str(tmp_path)]) == 0
    text = (tmp_path / "device_beside.md").read_text()
    assert "| H100 | 989 | 3,350 | 295 | 784 (2026-11-27_7fae342) | 2,890 | 271 |" in text
    assert "| A6000 | 155 | 768 | 202 | - | - | - |" in text
    assert "calibrated, chunk 256 at length 3072: A6000 1.00x, H100 1.30x: moves with the device" in text


def test_a_lease_whose_launch_step_timed_no_engine_iteration_says_so_rather_than_an_empty_table(tmp_path):
    folder = synthetic_lease(tmp_path / "h200" / "2026-11-01_abc1234")
    launch = folder / "steps" / "launch" / "result.json"
    # An older suite's launch step: graph and eager times of decodes, no engine_ms[...].
    launch.write_text(json.dumps(step_record("launch", [{"metric": "graph_ms[b=1]", "value": 8.8}])))
    found, t, lease = attribute.rows(folder)
    assert not [r for r in found if r["kind"] == "iteration"]
    text = attribute.markdown(found, t, lease)
    assert "| iteration |" not in text and "No iteration attributed" in text
    assert "Targets a floor" not in text
    assert "## The paper's claims" in text
