"""The sweep stage imports at the top of its modules: keeping `lkv sweep --help` light is the verb's job
(:mod:`lkv.commands.sweep` imports :mod:`lkv.sweep.run` once the options are parsed), not the stage's."""

import ast
from pathlib import Path

import lkv.sweep

SWEEP = Path(lkv.sweep.__file__).parent


def function_imports(source: str) -> list[int]:
    """The lines of the imports inside a function (or method) of ``source``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines += [n.lineno for n in ast.walk(node) if isinstance(n, ast.Import | ast.ImportFrom)]
    return sorted(lines)


def test_no_module_of_the_sweep_stage_imports_inside_a_function():
    found = {
        path.name: lines
        for path in sorted(SWEEP.glob("*.py"))
        if (lines := function_imports(path.read_text()))
    }
    assert not found, f"imports inside functions (module: lines): {found}"


def test_an_import_inside_a_method_is_found():
    assert function_imports("import os\n\nclass A:\n    def f(self):\n        import sys\n") == [5]
