"""Questions about Python source, asked of answers and tests before anything runs."""

from __future__ import annotations

import ast


def parses(code: str) -> bool:
    """Whether ``code`` is a syntactically valid Python module."""
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


def defines(code: str, name: str) -> bool:
    """Whether ``code`` parses and defines ``name`` at top level (a function or class)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return any(
        isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name
        for node in tree.body
    )


def unbound_names(code: str) -> set[str]:
    """Names ``code`` reads that it never binds anywhere and that are no builtins: what it
    needs from the namespace it runs in (an answer's class that MBPP-style tests build)."""
    import builtins

    tree = ast.parse(code)
    read, bound = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return read - bound - set(vars(builtins))


def top_level_classes(code: str) -> str:
    """The source of the classes ``code`` defines at top level (decorators included), one
    after another: what tests that build their own objects share with the answer's side."""
    tree = ast.parse(code)
    lines = code.splitlines(keepends=True)
    parts = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            first = min([node.lineno, *(decorator.lineno for decorator in node.decorator_list)])
            parts.append("".join(lines[first - 1:node.end_lineno]))
    return "\n".join(part.rstrip("\n") + "\n" for part in parts)
