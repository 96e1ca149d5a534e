"""Every function of the package fits on a screen and every module stays small enough to read whole.

Measured on the live tree from the AST (a function's lines: its ``def`` to its last line, decorators
left out; a module's: all its lines). kernels/ is outside: a Triton kernel is one long function by
nature.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "sarathi_lab"
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 400
# "module.py::function" allowed over the limit, each with why: delete an entry once it fits.
LONG_FUNCTIONS: dict[str, str] = {
}


def long_functions(source: str, name: str, limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """{"name::function": lines} of the functions (methods and nested ones too) over ``limit`` lines."""
    found = {}
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                found[f"{name}::{node.name}"] = lines
    return found


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_function_is_longer_than_a_screen():
    found = {}
    for path in _modules():
        found |= long_functions(path.read_text(), path.relative_to(PACKAGE).as_posix())
    new = {k: v for k, v in found.items() if k not in LONG_FUNCTIONS}
    assert not new, f"functions over {MAX_FUNCTION_LINES} lines (split them into named pieces): {new}"
    fitted = sorted(set(LONG_FUNCTIONS) - set(found))
    assert not fitted, f"these fit now: remove them from LONG_FUNCTIONS: {fitted}"


def test_no_module_is_longer_than_a_read():
    found = {path.relative_to(PACKAGE).as_posix(): n for path in _modules()
             if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not found, f"modules over {MAX_MODULE_LINES} lines (split them by what they hold): {found}"


@pytest.mark.parametrize("body_lines, over", [(MAX_FUNCTION_LINES - 1, False), (MAX_FUNCTION_LINES, True)])
def test_the_measure_counts_a_function_from_its_def_to_its_last_line(body_lines, over):
    body = "".join(f"    x{i} = {i}\n" for i in range(body_lines))
    source = f"@decorated\ndef outer():\n{body}\n\nclass C:\n    def method(self):\n{body.replace('    ', '        ')}"
    found = long_functions(source, "probe.py")
    expected = {"probe.py::outer": body_lines + 1, "probe.py::method": body_lines + 1} if over else {}
    assert found == expected
