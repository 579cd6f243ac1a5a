"""No function of the verbs (lkv/commands/) or of the evaluation's dispatch (lkv/eval/runner.py) runs over
:data:`LIMIT` lines: a verb orchestrates, its checks live in a settings dataclass and its steps in functions of
their own. A docstring does not count (a verb's is its ``--help`` text)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 80
FILES = [*sorted((ROOT / "lkv" / "commands").glob("*.py")), ROOT / "lkv" / "eval" / "runner.py"]


def code_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from ``def`` to the function's last line, less those of its docstring."""
    lines = function.end_lineno - function.lineno + 1
    first = function.body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        lines -= first.end_lineno - first.lineno + 1
    return lines


def function_lengths() -> dict[str, int]:
    """``path:name`` → :func:`code_lines` of every function and method (nested ones too) in :data:`FILES`."""
    lengths = {}
    for path in FILES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lengths[f"{path.relative_to(ROOT)}:{node.name}"] = code_lines(node)
    return lengths


def test_no_verb_or_dispatch_function_is_over_the_limit():
    too_long = {name: lines for name, lines in function_lengths().items() if lines > LIMIT}
    assert not too_long, f"functions over {LIMIT} lines (docstrings aside): {too_long}"


def test_a_docstring_does_not_count_and_the_body_does():
    (function,) = ast.parse('def f():\n    """one\n    two"""\n    a = 1\n    return a\n').body
    assert code_lines(function) == 3
