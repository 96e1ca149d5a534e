"""The package's one runner of measurements: ``python -m sarathi_lab.measure`` lists every
registered command, a line each, and runs one by name, as a user starts it."""
from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from sarathi_lab.harness.tasks import task_names
from sarathi_lab.measure import __main__ as runner
from sarathi_lab.measure import commands
from sarathi_lab.measure.gpu.plan import STEPS

ROOT = commands.PACKAGE.parent
# Read their arguments themselves: the suite's worker a JSON job, gpu_parts an archive.
NO_PARSER = {"gpu_worker", "gpu_parts"}


def test_the_listing_names_every_command_gpu_step_and_task_within_the_width():
    lines = runner.listing().splitlines()
    named = [line.split()[0] for line in lines if line.startswith("  ")]
    every = [*commands.COMMANDS, "all", *(s.name for s in STEPS), *task_names()]
    assert sorted(named) == sorted(every)
    assert max(map(len, lines)) <= runner.WIDTH


def test_what_it_runs_by_name_has_one_name_each_and_an_unknown_one_is_refused():
    assert len(commands.COMMANDS) == sum(len(g.commands) for g in commands.GROUPS)
    done = subprocess.run([sys.executable, "-m", "sarathi_lab.measure", "nope"], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 2 and "measurement 'nope' is invalid" in done.stderr


@pytest.mark.parametrize("name", sorted(commands.COMMANDS))
def test_every_command_s_target_exists_and_names_itself_by_its_new_form(name):
    """Read from the source, not imported (some load torch or need a GPU)."""
    attributes = commands.COMMANDS[name].partition(":")[2]
    path = commands.module_file(name)
    tree = ast.parse(path.read_text())
    top = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)} | {
        t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    assert attributes.split(".")[0] in top, (name, path)
    # The entry point is measure's alone: no module it runs is started by its own path.
    assert "__name__ ==" not in path.read_text(), path
    text = path.read_text()
    if name not in NO_PARSER and "CASE.run" not in commands.COMMANDS[name]:
        assert f"sarathi_lab.measure {name}" in text or f'bench_parser("{name}"' in text, \
            f"{path}: its parser's prog names another command"


def test_the_package_has_three_entry_points():
    found = sorted(str(p.relative_to(ROOT)) for p in commands.PACKAGE.rglob("*.py")
                   if "__name__ ==" in p.read_text() or p.name == "__main__.py")
    assert found == ["sarathi_lab/measure/__main__.py", "sarathi_lab/produce.py", "sarathi_lab/run.py"]


@pytest.mark.parametrize("name", ["publish", "sim_pipeline", "gpu_collect"])
def test_a_command_s_help_is_its_own_under_its_new_name(name):
    done = subprocess.run([sys.executable, "-m", "sarathi_lab.measure", name, "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: python -m sarathi_lab.measure {name}"), done.stdout[:300]
