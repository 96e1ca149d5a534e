"""The simulator's ``floor`` cost model, a lease's sweeps rerun on it beside the lease
(``measure.sim_check.floor_claims``), and the attribution of a claim by them."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sarathi_lab.analysis import attribute, claim_attribution
from sarathi_lab.measure.sim_check import floor_claims
from sarathi_lab.model import load_config
from sarathi_lab.model.floors import sequential_floor
from sarathi_lab.model.shape import Shape
from sarathi_lab.sim import CostModel, load_device
from sarathi_lab.sim.device import at_floors
from tests.test_attribution import _write_csv, synthetic_lease

KEPT = Path(__file__).resolve().parents[1] / "docs" / "gpu" / "h200" / "2026-11-27_9e2ae41"
CLAIM = "SARATHI beats Orca's best case at every sequence length"
SWEEP = ("sarathi_lab.run -m experiment=orca_compare hydra.sweep.dir=/x/multiruns/gpu model=llama-13b "
         "device=cuda dtype=bfloat16 logger=none on_existing=skip seq_len=256 batch_size=4 chunk=64 "
         "pd_ratio=15 workload.num_requests=8")


def test_the_floor_device_reaches_every_peak_with_no_tile_floor_or_host_time():
    floor = at_floors(load_device("h200"))
    assert (floor.peak_flops, floor.memory_bandwidth) == (989e12, 4800e9)
    assert (floor.tile_tokens, floor.attention_tile, floor.kv_reread) == (1, 1, False)
    assert floor.gemm_flops_efficiency == floor.attention_bandwidth_efficiency == 1.0
    assert floor.kernel_floor_s == floor.host_overhead_s == floor.prepare_s(4096) == 0.0


@settings(max_examples=40, deadline=None)
@given(device=st.sampled_from(["a6000", "h100", "h200"]),
       prefills=st.lists(st.tuples(st.integers(1, 1024), st.integers(0, 3072)).map(
           lambda cp: (cp[0], cp[0] + cp[1])), max_size=2),
       decodes=st.lists(st.integers(1, 4096), max_size=24))
def test_no_iteration_costs_less_than_its_floor(device, prefills, decodes):
    if not (prefills or decodes):
        return
    floor = CostModel.for_device(device, "llama-13b", "floor").iteration_cost(prefills, decodes)
    roof = CostModel.for_device(device, "llama-13b", "roofline").iteration_cost(prefills, decodes)
    assert floor.forward_s <= roof.forward_s * (1 + 1e-9)
    assert floor.prepare_s == 0.0


@settings(max_examples=30, deadline=None)
@given(prefills=st.lists(st.tuples(st.integers(1, 2048), st.integers(0, 3072)).map(
           lambda cp: (cp[0], cp[0] + cp[1])), max_size=2),
       decodes=st.lists(st.integers(1, 4096), max_size=24))
# A memory-bound prefill beside a compute-bound one: two kernels in the simulator, one here.
@example(prefills=[(1, 1622), (725, 2220)], decodes=[])
def test_the_simulator_s_floor_is_the_engine_s_sequential_floor_with_elementwise_bytes(prefills, decodes):
    # Two counts of one floor (the simulator's roofline, model/shape.py's kernel costs): the GEMMs
    # agree exactly; with one attention kernel in both the whole within 1% (the LM head's count).
    # The simulator runs each prefill's attention and the decodes' as kernels of their own, the
    # engine's floor all of them as one: a kernel's floor is the slower of its flops and bytes, so
    # a sum of such floors is at least the floor of the sums, and there the simulator's is the higher.
    if not (prefills or decodes):
        return
    device, shape = load_device("h100"), Shape.of(load_config("llama-13b"))
    queries = [c for c, _ in prefills] + [1] * len(decodes)
    contexts = [x for _, x in prefills] + decodes
    gbps, gflops = device.memory_bandwidth / 1e9, device.peak_flops / 1e9
    engine = sequential_floor(shape, queries, contexts, len(queries), 2, gbps, gflops)
    # The elementwise passes but the KV write, which the sequential floor holds as a kernel.
    per_token = sum(shape.elementwise_bytes_per_token(2).values()) * shape.layers - shape.kv_bytes_per_token(2)
    expected = engine.seconds + per_token * sum(queries) / (gbps * 1e9)
    sim = CostModel.for_device("h100", "llama-13b", "floor").iteration_cost(prefills, decodes)
    for gemm in shape.gemms:
        assert sim.ops[gemm] == pytest.approx(engine.kernels[gemm].seconds, rel=1e-9)
    if len(prefills) + bool(decodes) > 1:
        assert sim.forward_s >= expected * 0.99
    else:
        assert sim.forward_s == pytest.approx(expected, rel=0.01)


def test_the_floor_has_no_tile_step_where_the_roofline_has_one():
    def step(model: str) -> float:
        cm = CostModel.for_device("h200", "llama-13b", model)
        return cm.iteration_cost([(257, 257)]).forward_s / cm.iteration_cost([(256, 256)]).forward_s
    assert step("floor") == pytest.approx(257 / 256, rel=0.01)
    assert step("roofline") > 1.2


def _lease(tmp_path: Path, notes: list[str], holds: str = "no") -> Path:
    folder = synthetic_lease(tmp_path / "h200" / "2026-11-01_abc1234")
    kept = json.loads((KEPT / "lease.json").read_text())
    (folder / "lease.json").write_text(json.dumps(kept | {"lease": folder.name, "commit": "abc1234"}))
    _write_csv(folder / "claims.csv", [{"experiment": "orca_compare", "claim": CLAIM,
                                        "ours": "length 256: SARATHI 0.90x", "holds": holds}])
    step = folder / "steps" / "paper.orca_compare"
    step.mkdir(parents=True)
    kept = json.loads((KEPT / "steps" / "paper.orca_compare" / "result.json").read_text())
    (step / "result.json").write_text(json.dumps(kept | {"notes": notes}))
    return folder


def test_the_lease_s_sweep_is_its_command_less_its_machine_and_folders(tmp_path):
    folder = _lease(tmp_path, [SWEEP])
    kept = floor_claims.sweep_overrides(folder, "orca_compare")
    assert kept[0] == "experiment=orca_compare" and "seq_len=256" in kept
    assert not [w for w in kept if w.split("=")[0] in ("hydra.sweep.dir", "device", "logger", "on_existing")]
    # A sweep that names no alignment ran fixed chunks; one that names it keeps its own.
    assert kept[-1] == "++scheduler.chunk_align=none"
    folder = _lease(tmp_path / "b", [SWEEP + " ++scheduler.chunk_align=none,tile"])
    assert floor_claims.sweep_overrides(folder, "orca_compare")[-1] == "++scheduler.chunk_align=none,tile"
    folder = _lease(tmp_path / "c", [])
    assert floor_claims.sweep_overrides(folder, "orca_compare") is None


def test_a_lease_s_command_cannot_point_the_rerun_elsewhere(tmp_path):
    hostile = SWEEP + (" hydra.run.dir=/tmp/x +hydra.sweep.subdir=../../x --config-dir=/x"
                       " hydra.searchpath=[file:///x] ~hydra.job.chdir hydra.sweeper.params=null")
    kept = floor_claims.sweep_overrides(_lease(tmp_path, [hostile]), "orca_compare")
    assert [w for w in kept if "hydra" in w or w.startswith("-")] == ["hydra.sweeper.params=null"]
    with pytest.raises(ValueError, match=r"result.json is invalid: its command is no command line"):
        floor_claims.sweep_overrides(_lease(tmp_path / "q", [SWEEP + " seed='0"]), "orca_compare")
    folder = _lease(tmp_path / "e", [SWEEP])
    _write_csv(folder / "claims.csv", [{"experiment": "../../etc", "claim": "x", "holds": "no"}])
    with pytest.raises(ValueError, match=r"claims.csv is invalid: experiment='../../etc' is no paper result"):
        floor_claims.short_claims(folder)


@pytest.mark.e2e
def test_floor_claims_rerun_the_lease_s_sweep_beside_it_and_attribute_reads_them(tmp_path, capsys):
    folder = _lease(tmp_path, [SWEEP])
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert floor_claims.main([str(folder)]) == 0
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before
    with open(tmp_path / "h200" / "2026-11-01_abc1234.floor_claims.csv", newline="") as f:
        (row,) = [r for r in csv.DictReader(f) if r.get("experiment") == "orca_compare"]
    assert row["floors"].startswith("length 256: SARATHI ") and row["cost_model"] == "floor"
    assert "wrote" in capsys.readouterr().out
    claim = next(r for r in attribute.rows(folder)[0] if r.get("experiment") == "orca_compare")
    assert claim["why"].startswith("at the H200's sequential floors (the lease's sweep on the simulator's")


@pytest.mark.e2e
def test_a_lease_s_sweep_the_simulator_refuses_is_one_line_naming_it(tmp_path, capsys):
    # It raised RuntimeError naming a temporary folder already deleted.
    folder = _lease(tmp_path, [SWEEP.replace("chunk=64", "chunk=-64")])
    with pytest.raises(SystemExit) as e:
        floor_claims.main([str(folder)])
    (line,) = capsys.readouterr().err.splitlines()
    assert e.value.code == 2 and line.startswith(
        f"error: {folder}/steps/paper.orca_compare/result.json's sweep did not run on the simulator (refused: ")
    assert "chunk=-64 is invalid: must be > 0" in line and line.endswith("; nothing was written")
    assert not list(tmp_path.rglob("*.floor_claims.csv"))


@pytest.mark.parametrize("holds, says", [("yes", "so our shortfall is our engine's"),
                                         ("no", "is 'no' at the floors too, so the device explains it")])
def test_a_schedule_claim_is_the_engine_s_where_the_floors_allow_it(tmp_path, holds, says):
    folder = _lease(tmp_path, [SWEEP])
    _write_csv(folder.parent / f"{folder.name}.floor_claims.csv",
               [{"experiment": "orca_compare", "claim": CLAIM, "floors": "SARATHI 1.23x",
                 "holds": holds, "sim_device": "h200", "cost_model": "floor", "overrides": ""}])
    claim = next(r for r in attribute.rows(folder)[0] if r.get("experiment") == "orca_compare")
    assert "SARATHI 1.23x" in claim["why"] and says in claim["why"]


def test_a_claim_without_floor_claims_says_how_to_make_them(tmp_path):
    claim = next(r for r in attribute.rows(_lease(tmp_path, [SWEEP]))[0]
                 if r.get("experiment") == "orca_compare")
    assert claim["why"] == claim_attribution.NO_FLOORS


def test_a_tile_step_is_the_device_s_kernels_never_a_floor(tmp_path):
    folder = _lease(tmp_path, [SWEEP])
    _write_csv(folder / "claims.csv", [{"experiment": "tile_quantization", "claim": "tile", "holds": "no",
                                        "ours": "+7.1% on average"}])
    claim = next(r for r in attribute.rows(folder)[0] if r["kind"] == "claim")
    assert claim["why"].startswith("a tile step is a kernel's, never a floor's")
    assert "the H200's kernels'" in claim["why"]
