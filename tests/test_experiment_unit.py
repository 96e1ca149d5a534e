"""A paper experiment is its YAML and its module (analysis/paper_results/<name>.py: its paper
numbers, derivation, verdict rule, claim attribution, smoke runs and figure), found by the registry:
no shared module lists the experiments or holds a fact one of them alone reads, and a result
registered nowhere else is picked up by every reader of those facts."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from sarathi_lab.analysis import attribute, claim_attribution, registry
from sarathi_lab.analysis.paper_result import PaperResult
from sarathi_lab.harness import scales
from sarathi_lab.measure.sim_check import sim_vs_gpu

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "sarathi_lab"
RESULTS_DIR = PACKAGE / "analysis" / "paper_results"
# Where the facts shared by several results live: each of their names is read by more than one result,
# or by a module that is no result's.
SHARED = ("paper", "derive")
# The wings whose tables would otherwise list the experiments (the harness below them names config keys
# and tasks, some spelt like an experiment: pd_ratio, capacity).
SCANNED = (PACKAGE / "analysis", PACKAGE / "measure")
# Lists of experiments outside their modules seen when this test was written, each with why it stays;
# the test fails on any other, and on an entry here that no longer occurs.
KNOWN_LISTS: dict[tuple[str, str], str] = {
    ("measure/gpu/queue.py", "decode_speedup, orca_compare"):
        "the GPU queue's most telling steps first: a paper step it does not name runs after them",
    ("measure/gpu/state.py", "per_token_cost, decode_speedup, pd_ratio"):
        "the figures copied out of a lease first: a figure it does not name follows",
    ("measure/sim_check/sim_chunk_align.py", "pd_ratio, orca_compare"):
        "the chunk-alignment check simulates these two results: they are its subject",
}


def _name_in(node: ast.AST, names: set[str]) -> str | None:
    """The result a literal names: "<name>", "paper.<name>" (a GPU step), or a tuple led by one."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        name = node.value.removeprefix("paper.")
        return name if name in names else None
    if isinstance(node, ast.Tuple) and node.elts:
        return _name_in(node.elts[0], names)
    return None


def experiment_lists(names: set[str], folders=SCANNED, package=PACKAGE) -> set[tuple[str, str]]:
    """(file, the names it lists) of every literal tuple, list, set or dict's keys naming two or more
    results (a tuple led by one names it), in ``folders`` outside paper_results/."""
    found = set()
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            if path.is_relative_to(RESULTS_DIR):
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Dict):
                    named = [n for k in node.keys if k is not None and (n := _name_in(k, names))]
                elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                    named = [n for e in node.elts if (n := _name_in(e, names))]
                else:
                    continue
                # One name alone is no list: a metric or config key spelt like its experiment.
                if len(named) > 1:
                    found.add((path.relative_to(package).as_posix(), ", ".join(named)))
    return found


def test_the_registry_is_the_only_list_of_paper_experiments():
    found = experiment_lists(set(registry.names()))
    unknown = sorted(found - set(KNOWN_LISTS))
    assert not unknown, ("a shared module lists paper experiments: make each entry a field of its "
                         f"PaperResult, read from the registry: {unknown}")
    assert not set(KNOWN_LISTS) - set(found), "a known list is gone: drop it from KNOWN_LISTS"


def test_the_scan_finds_a_list_of_experiments(tmp_path):
    # The scan itself can fail: a table keyed by results, as claim_attribution's was, a list of
    # them, as sim_vs_gpu's smoke was; one name alone (a config key spelt alike) is no list.
    table = tmp_path / "analysis" / "table.py"
    table.parent.mkdir()
    table.write_text('ATTRIBUTORS = {"chunk_overhead": len, "decode_speedup": len}\n'
                     'KINDS = ("orca_compare", "paper.per_token_cost")\nKEYS = ("seq_len", "pd_ratio")\n')
    assert experiment_lists(set(registry.names()), [tmp_path / "analysis"], tmp_path) == {
        ("analysis/table.py", "chunk_overhead, decode_speedup"),
        ("analysis/table.py", "orca_compare, per_token_cost")}


def _source_texts() -> dict[str, str]:
    """Every module of the package and every notebook's code, by path."""
    texts = {p.relative_to(ROOT).as_posix(): p.read_text() for p in PACKAGE.rglob("*.py")}
    for notebook in (ROOT / "notebooks").glob("*.ipynb"):
        cells = json.loads(notebook.read_text())["cells"]
        texts[notebook.relative_to(ROOT).as_posix()] = "\n".join(
            "".join(c["source"]) for c in cells if c["cell_type"] == "code")
    return texts


def _public_names(module: str) -> list[str]:
    tree = ast.parse((PACKAGE / "analysis" / f"{module}.py").read_text())
    names = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    names += [t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
              if isinstance(t, ast.Name)]
    return [n for n in names if not n.startswith("_")]


def single_result_facts(module: str, texts: dict[str, str], names=None) -> dict[str, str]:
    """{name: the one result reading it} of ``module``'s names (default: its public ones) that one
    paper result alone reads (``module.NAME`` or ``from ...module import NAME``), the module itself
    using it nowhere."""
    own = texts[f"sarathi_lab/analysis/{module}.py"]
    found = {}
    for name in names or _public_names(module):
        readers = [path for path, text in texts.items()
                   if re.search(rf"\b{module}\.{name}\b", text)
                   or re.search(rf"from sarathi_lab\.analysis\.{module} import [^\n]*\b{name}\b", text)]
        used_inside = len(re.findall(rf"\b{name}\b", own)) > 1
        if (len(readers) == 1 and readers[0].startswith("sarathi_lab/analysis/paper_results/")
                and not used_inside):
            found[name] = readers[0]
    return found


@pytest.mark.parametrize("module", SHARED)
def test_a_fact_one_result_alone_reads_lives_in_its_module(module):
    found = single_result_facts(module, _source_texts())
    assert not found, f"analysis/{module}.py holds what one result alone reads; move it there: {found}"


def test_the_single_reader_check_can_fail():
    texts = _source_texts()
    texts["sarathi_lab/analysis/paper.py"] += "\nTOY_ONLY = 1.5\n"
    texts["sarathi_lab/analysis/paper_results/toy.py"] = "x = paper.TOY_ONLY\n"
    found = single_result_facts("paper", texts, [*_public_names("paper"), "TOY_ONLY"])
    assert found == {"TOY_ONLY": "sarathi_lab/analysis/paper_results/toy.py"}


def _toy_attribute(row: dict, lease, t) -> dict:
    return claim_attribution.attribution_row(row, "toy device", "toy engine", f"toy on {lease.device}")


TOY = PaperResult(name="toy_unit", order=1, claims=lambda results: [], figure=lambda *a: None,
                  attribute=_toy_attribute, smoke_runs=(("seed=1",), ()))


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setattr(registry, "RESULTS", (TOY, *registry.RESULTS))
    return TOY


def test_a_registered_result_s_attribution_is_used_and_others_fall_back_to_the_floors(toy, monkeypatch):
    rows = [{"experiment": "toy_unit", "claim": "Toy holds"},
            {"experiment": "scheduler_latency", "claim": "Stall-free"}]
    monkeypatch.setattr(attribute, "short_of_yes", lambda lease: rows)
    lease = SimpleNamespace(device="h200", floors={})
    toy_row, other = attribute.claim_rows(lease, None)
    assert (toy_row["experiment"], toy_row["why"]) == ("toy_unit", "toy on h200")
    assert (other["experiment"], other["why"]) == ("scheduler_latency", claim_attribution.NO_FLOORS)


def test_a_registered_result_s_smoke_runs_are_run_by_sim_vs_gpu_smoke(toy, monkeypatch, tmp_path):
    ran = []
    monkeypatch.setattr(sim_vs_gpu, "run_in_process", lambda argv, dest: ran.append((argv, dest)))
    monkeypatch.setattr(scales, "overrides", lambda name, scale: [f"scale={scale}"])
    sim_vs_gpu._smoke_runs(tmp_path)
    smoke = tmp_path / "toy_unit" / "multiruns" / "smoke"
    assert ran[:2] == [(["experiment=toy_unit", "scale=dry", "seed=1"], smoke / "0_seed=1"),
                       (["experiment=toy_unit", "scale=dry"], smoke / "1_tiny")]
    # Every registered result with smoke runs, and none without.
    assert ({argv[0].removeprefix("experiment=") for argv, _ in ran}
            == {r.name for r in registry.RESULTS if r.smoke_runs})
    assert {r.name for r in registry.RESULTS if not r.smoke_runs} >= {"capacity", "pipeline_bubbles"}
