"""The schema documents itself: every setting has a description, docs/config-reference.md is
generated from it and up to date, task kinds come from the tasks registry, and every
shipped experiments file validates."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from matrixrl import grid as G
from matrixrl.config import Config, HfScale, TinyScale, load_config
from matrixrl.config.messages import kinds
from matrixrl.settings import kind_values, models_in
from matrixrl.tasks import TASK_KINDS, TASK_SETTINGS
from matrixrl.workflows import WORKFLOWS
from matrixrl.workflows.styles import PromptSettings

from conftest import EXPERIMENTS, REPO, script_module

reference = script_module("tools/config_reference.py")
COMMAND, fields, main = reference.COMMAND, reference.fields, reference.main
SHIPPED = [EXPERIMENTS, *sorted((REPO / "examples").glob("*.yaml"))]


# --- descriptions and the generated reference -------------------------------------------------


def test_every_setting_has_a_description() -> None:
    missing = [
        f"{path} ({model.__module__}.{model.__qualname__})"
        for path, model, _, field in fields()
        if not (field.description or "").strip()
    ]
    assert not missing, "settings without a description: " + ", ".join(dict.fromkeys(missing))


def test_the_walk_reaches_every_section_and_kind() -> None:
    reached = {model for _, _, _, field in fields() for model in models_in(field.annotation)}
    workflows = {workflow.settings_model for workflow in WORKFLOWS.values()}
    expected = {TinyScale, HfScale, PromptSettings, *TASK_SETTINGS, *workflows}
    assert expected <= reached, expected - reached
    paths = {path for path, *_ in fields()}
    assert {"train.max_grad_norm", "scales.NAME.warmstart.lr", "scales.NAME.train.lr", "tasks.NAME.verify_timeout_s"} <= paths


def test_the_configuration_reference_is_up_to_date() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}  # this checkout's
    result = subprocess.run(
        [sys.executable, "tools/config_reference.py", "--check"], cwd=REPO, capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr


def test_a_stale_reference_is_named_in_one_line(tmp_path: Path, capsys) -> None:
    doc = tmp_path / "config-reference.md"
    doc.write_text("# an old reference\n")
    assert main(["--check", "--path", str(doc)]) == 1
    assert capsys.readouterr().err == f"{doc} is out of date; run {COMMAND}\n"
    assert main(["--path", str(doc)]) == 0
    assert main(["--check", "--path", str(doc)]) == 0
    text = doc.read_text()
    for key in ("**`train.max_grad_norm`**", "**`tasks.NAME.timeout_s`**", "(kind: humaneval | code_generic)"):
        assert key in text
    assert "`train.threads`** · integer ≥ 1 · default `1` · **runtime**" in text


# --- task kinds come from the tasks package -----------------------------------------------------


def test_task_kinds_are_the_registry_in_its_order() -> None:
    for kind, task in TASK_KINDS.items():
        assert kind in kind_values(task.Settings), f"TASK_KINDS[{kind!r}]: {task.__name__}.Settings has no kind {kind!r}"
    assert kinds("tasks") == tuple(TASK_KINDS)
    assert models_in(Config.model_fields["tasks"].annotation) == list(TASK_SETTINGS)


def test_tasks_and_workflows_do_not_import_the_config() -> None:
    package = REPO / "matrixrl"
    offenders = []
    for folder in ("tasks", "workflows"):
        for path in sorted((package / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
                if any(n == "matrixrl.config" or n.startswith("matrixrl.config.") for n in names):
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not offenders, offenders


# --- every shipped experiments file ------------------------------------------------------------


def _missing_file(path: Path) -> str | None:
    """Why ``path`` cannot be loaded here: a data file or model folder it names is absent."""
    raw = yaml.safe_load(path.read_text()) or {}
    for section in ("scales", "tasks"):
        for name, entry in (raw.get(section) or {}).items():
            target = entry.get("path") if isinstance(entry, dict) else None
            if not isinstance(target, str):
                continue
            if section == "scales" and not target.startswith(("/", "./", "../", "~")):
                continue  # a hub id (or a folder beside the file, which load_config checks)
            resolved = (path.parent / Path(target).expanduser()).resolve()
            if not resolved.exists():
                return f"{path.name}: {section}.{name}.path {resolved} is not on this machine"
    return None


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_every_shipped_experiments_file_validates(path: Path) -> None:
    missing = _missing_file(path)
    if missing:
        pytest.skip(missing)
    cfg = load_config(path)
    assert G.cells(cfg)
    for cell in G.runs(cfg):
        G.cell_spec(cfg, cell)
