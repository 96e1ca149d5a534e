"""A GPU step is its module (sarathi_lab/measure/gpu/steps/<group>.py): its ``run`` and its ``STEP``
(order, minutes, --plan's line, the paths its result depends on, its figure), which the planner,
the staleness hash and the report read, so adding a step touches that module and its test alone."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from sarathi_lab.config import REPO_ROOT
from sarathi_lab.measure.gpu import engine_code, plan, report, steps
from sarathi_lab.measure.gpu.steps import Declared

SHARED = ("plan.py", "engine_code.py", "report.py")


def test_every_head_step_is_a_module_declaring_it_in_order():
    head = steps.head()
    assert [s.name for s in plan.HEAD] == list(head) == [
        s.name for s in plan.STEPS if s.name in head]
    assert [d.order for d in head.values()] == sorted(d.order for d in head.values())
    for step in plan.HEAD:
        module = sys.modules[f"{steps.__name__}.{step.name}"]
        assert callable(module.run) and module.STEP is head[step.name]
        assert (step.minutes, step.what) == (head[step.name].minutes, head[step.name].what)
    # The planner's own steps are declared by their group's module too (paths, not a place).
    assert {s.group for s in plan.STEPS} <= set(steps.declared())


def test_every_declared_path_exists_and_is_hashed():
    for group, declared in steps.declared().items():
        names = [s.name for s in plan.STEPS if s.group == group]
        assert names, f"steps/{group}.py declares a step the planner makes none of"
        for name in names:
            paths = engine_code.paths_of(name)
            assert f"sarathi_lab/measure/gpu/steps/{group}.py" in paths
            assert set(declared.paths) | set(declared.step_paths(name)) <= set(paths)
            missing = [p for p in paths if not (REPO_ROOT / p).exists()]
            assert not missing, f"{name}: declared paths not in the repo: {missing}"


def _string_literals(path: Path) -> set[str]:
    return {node.value for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)}


def named_groups(path: Path, groups) -> set[str]:
    """The head steps a module names in a string literal (``"<group>"`` or ``"<group>.<arg>"``)."""
    return {g for text in _string_literals(path) for g in groups
            if text == g or text.startswith(f"{g}.")}


def test_no_shared_module_names_a_head_step():
    folder = Path(plan.__file__).parent
    for name in SHARED:
        assert not named_groups(folder / name, steps.head()), (
            f"measure/gpu/{name} names a step: read it from the step module's STEP instead")


def test_the_scan_finds_a_named_step(tmp_path):
    source = tmp_path / "table.py"
    source.write_text('PATHS = {"env": ("a",), "launch.pod": ()}\nWHAT = "the env step"\n')
    assert named_groups(source, steps.head()) == {"env", "launch"}


def test_the_report_draws_each_module_s_figure(tmp_path):
    figures = {d.figure_name for d in steps.declared().values() if d.figure is not None}
    assert figures == {"kernel_breakdown", "attention", "overhead", "kernels"}
    # An empty suite folder: every figure is asked for and none drawn.
    assert report.write_report(tmp_path) == [f"{name}: nothing to draw yet" for name in
                                             [d.figure_name for d in steps.declared().values()
                                              if d.figure is not None]]


TOY = '''
from sarathi_lab.measure.gpu.steps import Declared

DRAWN = []


def figure(out):
    DRAWN.append(out)
    return True


def run(ctx, step):
    return [], []


STEP = Declared(order=85, minutes=0.5, what="a toy", paths=("sarathi_lab/config.py",),
                figure=figure, figure_name="toy")
'''


@pytest.fixture
def toy_step(tmp_path, monkeypatch):
    """A step module added beside the others, and nothing else."""
    (tmp_path / "toy.py").write_text(TOY)
    monkeypatch.setattr(steps, "__path__", [*steps.__path__, str(tmp_path)])
    steps.declared.cache_clear()
    yield f"{steps.__name__}.toy"
    steps.declared.cache_clear()
    sys.modules.pop(f"{steps.__name__}.toy", None)


def test_adding_a_step_is_adding_its_module(toy_step, tmp_path):
    built = plan.build_steps()
    names = [s.name for s in built]
    assert names[:len(plan.HEAD) + 1] == [*(s.name for s in plan.HEAD), "toy"]
    assert built[names.index("toy")].minutes == 0.5
    assert engine_code.paths_of("toy") == ("sarathi_lab/config.py",
                                           "sarathi_lab/measure/gpu/steps/toy.py")
    notes = report.write_report(tmp_path / "out")
    assert "toy: nothing to draw yet" not in notes and len(notes) == 4
    assert sys.modules[toy_step].DRAWN == [tmp_path / "out"]


def test_a_declaration_that_cannot_work_fails_naming_its_key(toy_step, monkeypatch):
    with pytest.raises(ValueError, match="STEP.figure_name='' is invalid"):
        Declared(paths=(), figure=lambda out: True)
    monkeypatch.setattr(sys.modules["sarathi_lab.measure.gpu.steps.env"], "STEP",
                        Declared(order=85, paths=()))
    with pytest.raises(ValueError, match=r"steps/(env|toy)\.py: STEP.order=85 is invalid"):
        steps.head()


def test_the_planner_and_plan_import_no_torch():
    # --plan runs where no GPU stack is installed: the step modules import it where they run.
    code = ("import contextlib, io, sys\n"
            "import sarathi_lab.measure.gpu.plan\n"
            "from sarathi_lab.measure.gpu.suite import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    assert main(['--plan']) == 0\n"
            "print(sorted(m for m in ('torch', 'triton', 'matplotlib') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                          text=True, check=True, timeout=300)
    assert done.stdout.strip() == "[]"
