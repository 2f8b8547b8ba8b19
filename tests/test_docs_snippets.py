"""Code in the docs that a reader copies: it must run, and say what the code does."""

from __future__ import annotations

import ast
import re

from conftest import REPO


def python_block(page: str, containing: str) -> str:
    """The ```python block of ``page`` (relative to the repository) that contains ``containing``."""
    blocks = re.findall(r"```python\n(.*?)```", (REPO / page).read_text(), flags=re.S)
    found = [block for block in blocks if containing in block]
    assert len(found) == 1, f"{page}: {len(found)} python blocks contain {containing!r}"
    return found[0]


def run_block(code: str):
    """Run ``code`` as a reader would; the value of its last line, an expression."""
    tree = ast.parse(code)
    last = tree.body.pop()
    assert isinstance(last, ast.Expr), "the block should end with the value it shows"
    namespace: dict = {}
    exec(compile(tree, "<docs>", "exec"), namespace)
    return eval(compile(ast.Expression(last.value), "<docs>", "eval"), namespace)


def test_extendings_job_kind_is_the_evaluate_kind_the_graph_has() -> None:
    # The page once showed an entry that did not exist and a Kind() missing its spec argument.
    from matrixrl.dag import KIND_OF

    assert run_block(python_block("docs/extending.md", "from matrixrl.dag import Kind")) == KIND_OF["evaluate"]
