"""Registries that mean it: a workflow and a report table defined outside the package, in a
plugin module named by MATRIXRL_PLUGINS, are planned, run and reported like the built-in ones
(docs/extending.md)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import matrixrl.config  # noqa: F401  (before any test swaps a registry: the schema is built from the real ones)
import matrixrl.plugins as plugins
import matrixrl.report as report
import matrixrl.workflows as workflows
from matrixrl.errors import RegistrationError
from matrixrl.plugins import ENV, Registry
from matrixrl.tasks.base import Problem
from matrixrl.workflows.base import Completion
from matrixrl.workflows.styles import PromptSettings, build_style

from conftest import run_cli, script_module

# The toy plugin: a workflow whose one role (speaker) is new to the styles, with its own
# prompt, and a table with one row per cell and its final accuracy.
PLUGIN = '''
"""A toy plugin: the echo workflow and the finals table."""

from matrixrl.report import Table, register_table
from matrixrl.workflows import Episode, RolePrompt, Turn, WorkflowBase, WorkflowSettings, register_workflow


class Settings(WorkflowSettings):
    """echo has no parameters."""


@register_workflow
class Echo(WorkflowBase):
    name = "echo"
    description = "a speaker answers in a role of its own (a plugin's toy)"
    roles = ("speaker",)
    settings_model = Settings
    prompts = {"speaker": RolePrompt("You answer {noun} problems in one line.", compact="{question}>")}

    def run(self, problems, groups, generate):
        prompts = [self.prompt("speaker", p) for p in problems]
        episodes = []
        for problem, group, prompt, completion in zip(problems, groups, prompts, generate("speaker", prompts)):
            answer = self.style.answer(completion.text)
            turn = Turn("speaker", "speaker0", 0, prompt, completion, answer=answer)
            episodes.append(Episode(problem=problem, group=group, turns=[turn], answer=answer))
        return episodes

    def warmstart_pairs(self, problems, rng):
        return [(self.prompt("speaker", p), self.style.target(p.answer)) for p in problems]


def finals(per_cell, confidence):
    from matrixrl.analysis.axes import axes_of, missing

    rows = per_cell.where(lambda row: not missing(row["final"]))
    return rows.frame(["cell", *axes_of(per_cell.columns), "final"])


register_table(Table("finals", "final accuracy per cell", "each cell's final accuracy", finals, ("final",)))
'''
MODULE = "matrixrl_toy_plugin"
PROBLEM = Problem("p1", "4+8+9", "21")


def write_plugin(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{MODULE}.py").write_text(PLUGIN)
    return folder


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The plugin imported in this process into copies of the registries (restored after)."""
    monkeypatch.setattr(workflows, "WORKFLOWS", Registry("workflow", workflows.WORKFLOWS))
    monkeypatch.setattr(report, "TABLES", Registry("table", report.TABLES))
    monkeypatch.setattr(report, "TABLE_NAMES", report.TABLE_NAMES)
    monkeypatch.syspath_prepend(str(write_plugin(tmp_path / "plugins")))
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    module = importlib.import_module(MODULE)
    yield module
    sys.modules.pop(MODULE, None)


def test_a_plugin_registers_its_workflow_and_table(toy):
    assert workflows.WORKFLOWS["echo"] is toy.Echo and list(workflows.WORKFLOWS)[-1] == "echo"
    assert report.TABLES["finals"].builder is toy.finals and report.TABLE_NAMES[-1] == "finals"
    from matrixrl.config.schema import workflows_model

    section = workflows_model(workflows.WORKFLOWS)
    assert list(section.model_fields)[-1] == "echo"
    assert section.model_fields["echo"].description == toy.Echo.description
    assert section().echo == toy.Settings()


def test_a_new_role_is_written_by_every_style_from_its_workflows_prompt(toy):
    from test_prompts import TEMPLATE, FakeGenerate

    from matrixrl.models.tiny import build_char_tokenizer

    compact = toy.Echo()
    assert compact.prompt("speaker", PROBLEM) == "4+8+9>"
    generate = FakeGenerate(lambda role, prompt: "21")
    (episode,) = compact.run([PROBLEM], [0], generate)
    assert generate.calls == [("speaker", ["4+8+9>"])]
    assert (episode.answer, [t.agent for t in episode.turns]) == ("21", ["speaker0"])
    assert compact.warmstart_pairs([PROBLEM], np.random.default_rng(0)) == [("4+8+9>", "21")]

    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = TEMPLATE
    for family, format in (("math", "\\boxed{}"), ("code", "```python")):
        style = build_style("chat", family, tokenizer, PromptSettings())
        prompt = toy.Echo(None, style).prompt("speaker", PROBLEM)
        noun = "math" if family == "math" else "programming"
        assert prompt.startswith(f"<|system|>You answer {noun} problems in one line. ") and format in prompt
        assert "<|user|>4+8+9<|end|>" in prompt
    shown = style.ask("speaker", PROBLEM, toy.Echo.prompts["speaker"], ["a", "b"])
    assert "Problem:\n4+8+9\n\nSolution 1:\na\n\nSolution 2:\nb" in shown
    assert build_style("compact").ask("speaker", PROBLEM, toy.Echo.prompts["speaker"], [" 2 1", "20"]) == "4+8+9>"


def test_a_registration_the_schema_would_miss_is_an_error():
    sealed = Registry("workflow", {"single": object})
    sealed.seal("the config schema (matrixrl.config)")
    with pytest.raises(RegistrationError, match="workflow 'echo' is registered after the config schema"):
        sealed.add("echo", object)
    with pytest.raises(ValueError, match="workflow 'single' is registered already"):
        Registry("workflow", {"single": int}).add("single", str)
    # The real registries are sealed once the config is imported.
    from matrixrl.tasks import TASK_KINDS

    assert workflows.WORKFLOWS.sealed_by and TASK_KINDS.sealed_by
    with pytest.raises(ValueError, match="lower-case"):
        workflows.register_workflow(type("Bad", (workflows.WorkflowBase,), {"name": "Bad-Name"}))


def two_roles(**attributes) -> type:
    """A drafter -> checker workflow, changed by ``attributes``; ``second``: the role its
    stage 2 asks generate for, ``label``: the role its stage-2 turns name."""
    from matrixrl.workflows import Episode, RolePrompt, Turn

    def run(self, problems, groups, generate):
        drafts = generate("drafter", [self.prompt("drafter", p) for p in problems])
        checks = generate(self.second, [self.prompt("checker", p, [d.text]) for p, d in zip(problems, drafts)])
        return [
            Episode(p, g, [Turn("drafter", "drafter0", 0, "", d), Turn(self.label, f"{self.label}0", 0, "", c)], c.text)
            for p, g, d, c in zip(problems, groups, drafts, checks)
        ]

    prompts = {"drafter": RolePrompt("You draft.", compact="{question}>"), "checker": RolePrompt("You check.", compact="{question}~{shown}=")}
    body = {
        "name": "draft_check", "description": "a drafter, then a checker", "roles": ("drafter", "checker"), "prompts": prompts,
        "second": "checker", "label": "checker", "run": run, **attributes,
    }  # fmt: skip
    return type("DraftCheck", (workflows.WorkflowBase,), body)


@pytest.mark.parametrize(
    ("attributes", "error"),
    [
        # A role used but not declared: under isolated it had no parameters, and a one-role
        # workflow's isolated cells were reported as copies of its shared ones.
        ({"roles": ("drafter",)}, "DraftCheck.prompts names role 'checker', which is not in its roles ('drafter',); add it to roles"),
        ({"parallel_roles": ("judge",)}, "DraftCheck.parallel_roles names role 'judge', which is not in its roles ('drafter', 'checker'); add it to roles"),
        ({"roles": ("drafter", "checker", "critic")}, "DraftCheck has no prompt for its role 'critic'; declare it in prompts as a RolePrompt "
         "(the styles write only the built-in roles: generator, evaluator, aggregator, orchestrator, worker, synthesizer)"),
        ({"roles": "drafter"}, "DraftCheck.roles must be a tuple of distinct role names (lower-case letters, digits, _), got 'drafter'"),
    ],
)  # fmt: skip
def test_a_workflows_roles_are_checked_when_it_is_registered(attributes, error):
    with pytest.raises(ValueError) as caught:
        workflows.register_workflow(two_roles(**attributes))
    assert str(caught.value) == f"workflow 'draft_check': {error}"


@pytest.mark.parametrize(
    ("attributes", "what"), [({"second": "judge"}, "called generate for"), ({"label": "judge"}, "returned a turn of")]
)
def test_a_rollout_refuses_a_role_the_workflow_does_not_declare(attributes, what):
    from matrixrl.errors import UserError
    from matrixrl.workflows.base import rollout

    def generate(role, prompts):
        return [Completion(role, [1], [2]) for _ in prompts]

    assert [t.role for t in rollout(two_roles()(), [PROBLEM], [0], generate)[0].turns] == ["drafter", "checker"]
    # Isolated failed with a bare KeyError: 'judge'; shared trained judge's turns as no one's.
    with pytest.raises(UserError) as caught:
        rollout(two_roles(**attributes)(), [PROBLEM], [0], generate)
    assert str(caught.value) == (
        f"workflow 'draft_check' {what} role 'judge', which is not one of its roles ('drafter', 'checker'); "
        "add it to DraftCheck.roles, or use one of those (docs/extending.md)"
    )


def test_a_plugins_code_is_in_the_digests_of_what_it_computes(toy, experiment, monkeypatch):
    # An edited plugin task generator reused the results of the old code ("Nothing to run").
    import matrixrl.tasks as tasks
    from matrixrl import grid as G
    from matrixrl.config import load_config
    from matrixrl.grid import Cell
    from matrixrl.tasks.arith import ArithTask

    source = Path(toy.__file__)
    assert workflows.workflow_code_digest("single") is None and tasks.task_code_digest("arith") is None
    echo = workflows.workflow_code_digest("echo")
    source.write_text(source.read_text() + "# edited\n")
    assert workflows.workflow_code_digest("echo") not in (None, echo)

    cell = Cell("single", "arith", "tiny-s", "shared", 0)

    def digests():
        G._BASE_DIGESTS.clear()
        config = load_config(experiment)
        spec = G.cell_spec(config, cell)
        return spec.train_digest(), spec.eval_digest(), G.base_eval_digest(spec), G.base_digest(config, "tiny-s")

    builtin = digests()
    # arith's kind as a plugin registers it (a subclass, in the plugin's module): every digest changes.
    kinds = Registry("task kind", {k: v for k, v in tasks.TASK_KINDS.items() if k != "arith"})
    kinds.add("arith", type("PluginArith", (ArithTask,), {"__module__": MODULE}), by=MODULE)
    monkeypatch.setattr(tasks, "TASK_KINDS", kinds)
    first = digests()
    assert all(a != b for a, b in zip(first, builtin))
    source.write_text(source.read_text() + "# edited again\n")
    assert all(a != b for a, b in zip(digests(), first))


def test_a_task_kinds_settings_and_family_are_checked_when_it_is_registered():
    from typing import Literal

    from pydantic import BaseModel

    from matrixrl.settings import Strict
    from matrixrl.tasks import register_task_kind
    from matrixrl.tasks.arith import ArithTask

    class Loose(BaseModel):  # a misspelt key under tasks: would be ignored
        kind: Literal["loose"] = "loose"

    class Settings(Strict):
        kind: Literal["loose"] = "loose"

    with pytest.raises(ValueError) as caught:
        register_task_kind("loose", type("LooseTask", (ArithTask,), {"Settings": Loose}))
    assert str(caught.value) == (
        "task kind 'loose': LooseTask.Settings must subclass matrixrl.settings.Strict (a plain pydantic BaseModel ignores unknown keys)"
    )
    # family 'text' failed only in a job, deep in eval_opt (KeyError: 'text').
    with pytest.raises(ValueError) as caught:
        register_task_kind("loose", type("TextTask", (ArithTask,), {"Settings": Settings, "family": "text"}))
    assert str(caught.value) == (
        "task kind 'loose': TextTask.family is 'text'; it must be one of math, code (a new family is more than a plugin: docs/extending.md)"
    )


def test_the_config_reference_is_not_written_with_plugins(monkeypatch, tmp_path, capsys):
    reference = script_module("tools/config_reference.py")
    monkeypatch.setenv(ENV, "toy")
    target = tmp_path / "config-reference.md"
    assert reference.main(["--path", str(target)]) == 2 and not target.exists()
    assert capsys.readouterr().err == (
        "Error: MATRIXRL_PLUGINS is set (toy), and docs/config-reference.md documents the package's own workflows and task "
        "kinds only; unset MATRIXRL_PLUGINS and run python tools/config_reference.py again\n"
    )


def test_a_plugin_that_is_not_on_the_path_is_named(monkeypatch):
    monkeypatch.setenv(ENV, " matrixrl_no_such_plugin ")
    monkeypatch.setattr(plugins, "_loaded", None)
    with pytest.raises(ImportError, match="MATRIXRL_PLUGINS names 'matrixrl_no_such_plugin', which is not importable"):
        plugins.load_plugins()
    assert plugins._loaded is None
    monkeypatch.setenv(ENV, "")
    plugins.load_plugins()
    assert plugins._loaded == ""


def test_the_command_names_a_plugin_that_is_not_on_the_path_in_one_line():
    # The CLI imports the registries as it starts, before any command's own error handling.
    env = {**os.environ, ENV: "matrixrl_no_such_plugin"}
    proc = subprocess.run([sys.executable, "-m", "matrixrl", "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "Error: MATRIXRL_PLUGINS names 'matrixrl_no_such_plugin', which is not importable here; put the folder that "
        "holds it on PYTHONPATH (docs/extending.md)\n"
    )


@pytest.mark.parametrize(
    ("source", "error", "fix"),
    [
        ("SETTINGS = {'a': 1}['b']\n", "KeyError: 'b'", "python -c 'import broken_plugin' shows the traceback"),
        ("import matrixrl_missing_dependency\n", "ModuleNotFoundError: No module named 'matrixrl_missing_dependency'",
         "install 'matrixrl_missing_dependency' or drop that import"),
    ],
    ids=["its-own-bug", "a-missing-dependency"],
)
def test_a_plugin_whose_import_raises_is_one_line_with_where(tmp_path, source, error, fix):
    (tmp_path / "broken_plugin.py").write_text("# a researcher's plugin\n" + source)
    env = {**os.environ, ENV: "broken_plugin", "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "matrixrl", "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        f"Error: MATRIXRL_PLUGINS names 'broken_plugin', whose import failed ({tmp_path / 'broken_plugin.py'}:2): "
        f"{error}; {fix}\n"
    )


@pytest.mark.parametrize("named", ["../plugins/toy", ".toy"])
def test_a_plugin_named_by_a_path_or_a_relative_name_is_one_line(named):
    env = {**os.environ, ENV: named}
    proc = subprocess.run([sys.executable, "-m", "matrixrl", "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        f"Error: MATRIXRL_PLUGINS names {named!r}, which is no module name; name each plugin as Python imports it "
        "(my_plugins.toy), with its folder on PYTHONPATH (docs/extending.md)\n"
    )


def test_a_plugin_that_takes_a_built_in_name_is_one_line(tmp_path):
    (tmp_path / "again.py").write_text(
        "from matrixrl.workflows import register_workflow\n"
        "from matrixrl.workflows.single import Single\n\n\n"
        "@register_workflow\n"
        "class Again(Single):\n"
        "    name = 'single'\n"
    )
    path = os.pathsep.join([str(tmp_path), *([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])])
    env = {**os.environ, ENV: "again", "PYTHONPATH": path}
    proc = subprocess.run([sys.executable, "-m", "matrixrl", "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "Error: MATRIXRL_PLUGINS names 'again', which cannot register: workflow 'single' is registered already "
        "(by matrixrl.workflows.single); give yours a name of its own\n"
    )


def test_without_the_plugin_its_workflow_is_unknown(experiment):
    result = run_cli("plan", "-c", experiment, "--set", "grid.workflow=[echo]")
    assert result.exit_code != 0
    assert (
        "grid.workflow: unknown workflow 'echo'; use one of: single, voting, eval_opt, orch_workers"
        "; or, if a plugin defines it, name its module in MATRIXRL_PLUGINS (docs/extending.md)"
    ) in result.stderr


# --- the whole way, in the processes of a run -------------------------------------------------


def matrixrl(env: dict, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "matrixrl", *args], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, f"matrixrl {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.mark.slow
def test_a_plugin_workflow_and_table_plan_run_and_report(tmp_path):
    from test_e2e import small_experiment, stored

    folder = write_plugin(tmp_path / "plugins")
    # Snakemake and its jobs run with PYTHONSAFEPATH: the plugin's folder goes on PYTHONPATH.
    path = os.pathsep.join([str(folder), *([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])])
    env = {**os.environ, ENV: MODULE, "PYTHONPATH": path}
    config = small_experiment(
        tmp_path / "grid",
        **{"train.steps": 2, "train.eval_every": 2, "train.problems_per_step": 4, "tasks.arith.n_eval": 16},
    )
    config.write_text(config.read_text().replace("- single\n", "- echo\n", 1))
    cell = "echo-arith-tiny-s-shared-s0"

    planned = json.loads(matrixrl(env, "plan", "-c", str(config), "--format", "json").stdout)
    assert cell in json.dumps(planned)
    # The help's words, whatever line (of its box) each falls on.
    assert "finals: each cell's final accuracy" in " ".join(matrixrl(env, "report", "--help").stdout.replace("│", " ").split())

    matrixrl(env, "run", "-c", str(config), "--cores", "2")
    # The forked training job trained the plugin's own role.
    assert ("speaker",) in stored(config.parent / "results", f"select distinct role from role_metrics where cell = '{cell}'")
    rows = json.loads(matrixrl(env, "report", "-c", str(config), "--table", "finals", "--format", "json").stdout)
    assert [(row["workflow"], row["task"], row["policy"], row["seed"]) for row in rows] == [("echo", "arith", "shared", 0)]
    assert list(rows[0])[-1] == "final" and 0 <= rows[0]["final"] <= 1
    text = matrixrl(env, "report", "-c", str(config), "--table", "finals").stdout
    assert "final accuracy per cell" in text and "echo" in text
    matrixrl(env, "report", "-c", str(config), "--html", str(tmp_path / "report.html"))
    assert '<section id="table-finals"><h2>final accuracy per cell</h2>' in (tmp_path / "report.html").read_text()
