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
