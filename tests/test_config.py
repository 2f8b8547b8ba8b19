"""experiments.yaml validation, --set and --only: the exact one-line error messages."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from matrixrl.config import (
    AXES,
    Config,
    ConfigError,
    apply_only,
    apply_set,
    load_config,
    parse_only,
    parse_set,
    validate,
)

from conftest import EXPERIMENTS, REPO

TRAIN_KEYS = (
    "steps, eval_every, checkpoint_every, keep_checkpoints, problems_per_step, group_size, lr, ppo_epochs, temperature, "
    "max_new_tokens, epsilon_low, epsilon_high, scale_rewards, reward, max_grad_norm, threads, micro_batch_tokens, rollout_batch_size, kl_beta, kl_beta_roles, use_bias_correction_kl, damper, "
    "damper_roles, damper_window, advantage_group, loss_type, importance_sampling_level, sapo_temperature_pos, "
    "sapo_temperature_neg, vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg"
)
ONLY_FORM = "expected AXIS=V1,V2 with AXIS one of workflow, task, scale, policy, seed, e.g. --only seed=0,1"


@pytest.fixture
def raw() -> dict:
    """The repository's experiments.yaml as plain data, to break one thing at a time."""
    return yaml.safe_load(EXPERIMENTS.read_text())


def error_of(raw: dict) -> str:
    with pytest.raises(ConfigError) as info:
        validate(raw, "E.yaml")
    message = str(info.value)
    assert "\n" not in message
    return message


def load_error(path: Path, sets=(), only=()) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, sets=list(sets), only=list(only))
    message = str(info.value)
    assert "\n" not in message
    return message


def write(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# --- the default file ----------------------------------------------------------------------


def test_default_file_loads() -> None:
    cfg = load_config(EXPERIMENTS)
    assert isinstance(cfg, Config)
    assert cfg.grid.scale == ["tiny-s", "tiny-m"]
    assert cfg.grid.seed == [0]
    assert set(cfg.scales) == {"tiny-s", "tiny-m"} and set(cfg.tasks) == {"arith", "pyfunc"}
    assert cfg.results_dir == str((EXPERIMENTS.parent / "results").resolve())


def test_results_dir_is_relative_to_the_config_file(tmp_path: Path, monkeypatch, raw: dict) -> None:
    sub = tmp_path / "study"
    sub.mkdir()
    path = write(sub / "exp.yaml", {**raw, "results_dir": "out/here"})
    monkeypatch.chdir(tmp_path)  # a relative -c path, from another directory
    cfg = load_config(Path("study/exp.yaml"))
    assert cfg.results_dir == str(sub.resolve() / "out" / "here")
    absolute = tmp_path / "elsewhere"
    write(path, {**raw, "results_dir": str(absolute)})
    assert load_config(path).results_dir == str(absolute.resolve())


def test_experiment_fixture_points_results_into_tmp(experiment: Path, tmp_path: Path) -> None:
    assert load_config(experiment).results_dir == str((tmp_path / "results").resolve())


# --- unknown keys ----------------------------------------------------------------------------


def test_unknown_top_level_key(raw: dict) -> None:
    raw["resutls_dir"] = "x"
    assert error_of(raw) == "E.yaml: resutls_dir: unknown key; did you mean results_dir?"
    del raw["resutls_dir"]
    raw["colour"] = "x"  # near no key: every valid one is listed
    assert error_of(raw) == (
        "E.yaml: colour: unknown key; valid keys here: "
        "results_dir, grid, scales, tasks, workflows, policies, prompts, train, eval, analysis, memory"
    )


def test_unknown_nested_key_suggests_the_nearest_or_lists_valid_keys(raw: dict) -> None:
    raw["train"]["stpes"] = 4
    assert error_of(raw) == "E.yaml: train.stpes: unknown key; did you mean steps?"
    del raw["train"]["stpes"]
    raw["train"]["colour"] = 4
    assert error_of(raw) == f"E.yaml: train.colour: unknown key; valid keys here: {TRAIN_KEYS}"


def test_an_unknown_workflow_under_workflows_suggests_the_nearest(raw: dict) -> None:
    raw["workflows"] = {"votng": {"n_votes": 3}}
    assert error_of(raw) == "E.yaml: workflows.votng: unknown key; did you mean voting?"


def test_a_key_under_a_workflow_with_no_settings_says_so(raw: dict) -> None:
    raw["workflows"] = {"single": {"n_votes": 3}}
    assert error_of(raw) == "E.yaml: workflows.single.n_votes: unknown key; workflows.single has no settings, remove it"


def test_unknown_key_in_a_grid(raw: dict) -> None:
    raw["grid"]["seeds"] = [0]
    assert error_of(raw) == "E.yaml: grid.seeds: unknown key; did you mean seed?"
    del raw["grid"]["seeds"]
    raw["grid"]["colour"] = [0]
    assert error_of(raw) == (
        "E.yaml: grid.colour: unknown key; valid keys here: workflow, task, scale, policy, seed, memory, "
        "or a setting's dotted key as an extra axis (e.g. train.lr)"
    )


def test_an_unknown_loss_or_level_suggests_the_nearest(raw: dict) -> None:
    raw["train"]["loss_type"] = "dapoo"
    assert error_of(raw) == "E.yaml: train.loss_type: unknown loss type 'dapoo'; did you mean dapo?"
    raw["train"]["loss_type"] = "ppo"
    assert error_of(raw) == (
        "E.yaml: train.loss_type: unknown loss type 'ppo'; use one of: dapo, grpo, dr_grpo, bnpo, cispo, sapo, "
        "luspo, vespo"
    )
    raw["train"]["loss_type"] = "grpo"
    raw["train"]["importance_sampling_level"] = "tokens"
    assert error_of(raw) == (
        "E.yaml: train.importance_sampling_level: unknown importance sampling level 'tokens'; did you mean token?"
    )
    del raw["train"]["importance_sampling_level"]
    raw["scales"]["tiny-s"]["train"] = {"loss_type": "gpro"}
    assert error_of(raw) == "E.yaml: scales.tiny-s.train.loss_type: unknown loss type 'gpro'; did you mean grpo?"


LUSPO_AT_TOKEN = (
    "loss_type luspo scales a sequence ratio's loss by the turn's length, so it needs importance_sampling_level: "
    "sequence (got token); set it, or use another loss_type"
)


def test_a_loss_at_a_level_it_does_not_run_at_is_refused_with_the_fix(raw: dict, tmp_path: Path) -> None:
    raw["train"]["loss_type"] = "luspo"
    assert error_of(raw) == f"E.yaml: train: {LUSPO_AT_TOKEN}"
    raw["train"].update(loss_type="vespo", importance_sampling_level="sequence")
    assert error_of(raw) == (
        "E.yaml: train: loss_type vespo weighs each turn by its own sequence ratio whatever the level, so "
        "importance_sampling_level: sequence would repeat token's run; set it to token"
    )
    raw["train"].update(loss_type="cispo", importance_sampling_level="token")
    assert error_of(raw) == (
        "E.yaml: train: loss_type cispo caps each token's importance weight at epsilon_high (0.28), below 1, so every "
        "token would be capped from the first pass; set epsilon_high: 5.0 (ScaleRL's ε_max, TRL's advice)"
    )
    raw["train"].update(loss_type="dapo")
    raw["scales"]["tiny-s"]["train"] = {"loss_type": "luspo"}  # merged over train:, which is fine alone
    assert error_of(raw) == f"E.yaml: scales.tiny-s.train: {LUSPO_AT_TOKEN}"
    del raw["scales"]["tiny-s"]["train"]
    path = write(tmp_path / "e.yaml", raw)
    assert load_error(path, sets=["grid.train.loss_type=[dapo, luspo]"]) == (
        f"{path} with --set 'grid.train.loss_type=[dapo, luspo]': grid.train.loss_type: with train.loss_type = 'luspo', train: {LUSPO_AT_TOKEN}"
    )
    raw["train"].update(loss_type="luspo", importance_sampling_level="sequence")
    assert validate(raw, "E.yaml").train.loss_type == "luspo"


def test_the_schema_reads_the_losses_registry_without_importing_torch() -> None:
    """train.loss_type's names and each loss's refusals come from matrixrl.config.loss_types, which
    the schema imports; neither may import torch (seconds, on every config check and `matrixrl plan`)
    nor the training package."""
    code = (
        "import sys\n"
        "from matrixrl.config.schema import LOSS_TYPES, Train, loss_problem\n"
        "from matrixrl.config.loss_types import REFUSALS\n"
        "assert LOSS_TYPES == tuple(REFUSALS) and LOSS_TYPES[0] == 'dapo', LOSS_TYPES\n"
        "assert 'matrixrl.train' not in sys.modules, 'the training package was imported'\n"
        "refused = sorted((loss, level) for loss in LOSS_TYPES for level in ('token', 'sequence')\n"
        "    if loss_problem(Train.model_construct(loss_type=loss, importance_sampling_level=level, epsilon_high=5.0)))\n"
        "assert refused == [('luspo', 'token'), ('vespo', 'sequence')], refused\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}  # this checkout's
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr


def test_unknown_key_in_a_named_scale_keeps_its_name(raw: dict) -> None:
    raw["scales"]["tiny-s"]["hiden_size"] = 64
    assert error_of(raw) == "E.yaml: scales.tiny-s.hiden_size: unknown key; did you mean hidden_size?"
    del raw["scales"]["tiny-s"]["hiden_size"]
    raw["scales"]["tiny-s"]["colour"] = 64
    assert error_of(raw) == (
        "E.yaml: scales.tiny-s.colour: unknown key; valid keys here: kind, hidden_size, "
        "num_layers, num_heads, num_kv_heads, intermediate_size, max_length, warmstart, prompt_style, train"
    )


def test_unknown_key_in_a_task_named_like_its_kind(raw: dict) -> None:
    # The task is named "arith" and is of kind "arith": the path keeps the name, the keys are the kind's.
    raw["tasks"]["arith"]["digitz"] = 2
    assert error_of(raw) == "E.yaml: tasks.arith.digitz: unknown key; did you mean digits?"
    del raw["tasks"]["arith"]["digitz"]
    raw["tasks"]["arith"]["colour"] = 2
    assert error_of(raw) == (
        "E.yaml: tasks.arith.colour: unknown key; valid keys here: kind, digits, terms, "
        "warmstart_terms, warmstart_digits, warmstart_hard_fraction, n_eval, seed"
    )


def test_unknown_key_in_a_scale_named_like_its_kind(raw: dict) -> None:
    raw["scales"]["tiny"] = copy.deepcopy(raw["scales"]["tiny-s"])
    raw["scales"]["tiny"]["warmstart"]["stepz"] = 1
    assert error_of(raw) == "E.yaml: scales.tiny.warmstart.stepz: unknown key; did you mean steps?"
    del raw["scales"]["tiny"]["warmstart"]["stepz"]
    raw["scales"]["tiny"]["warmstart"]["colour"] = 1
    assert error_of(raw) == (
        "E.yaml: scales.tiny.warmstart.colour: unknown key; valid keys here: steps, batch_size, lr, seed"
    )


# --- wrong values ----------------------------------------------------------------------------


def test_wrong_type(raw: dict) -> None:
    raw["train"]["steps"] = "abc"
    assert error_of(raw) == "E.yaml: train.steps: expected an integer (got 'abc')"


def test_wrong_type_in_a_file(tmp_path: Path) -> None:
    text = EXPERIMENTS.read_text().replace("  steps: 40\n", "  steps: abc\n")
    path = tmp_path / "experiments.yaml"
    path.write_text(text)
    assert load_error(path) == f"{path}: train.steps: expected an integer (got 'abc')"


def test_out_of_range(raw: dict) -> None:
    raw["train"]["steps"] = 0
    assert error_of(raw) == "E.yaml: train.steps: must be greater than or equal to 1 (got 0)"


def test_out_of_range_in_a_named_task(raw: dict) -> None:
    raw["tasks"]["arith"]["digits"] = 9
    assert error_of(raw) == "E.yaml: tasks.arith.digits: must be less than or equal to 6 (got 9)"


def test_an_infinite_analysis_threshold_is_refused(raw: dict) -> None:
    # .inf would switch the cliff rule off without a word: no drop exceeds infinite SEs.
    raw["analysis"] = {"cliff_noise_se": float("inf")}
    assert error_of(raw) == "E.yaml: analysis.cliff_noise_se: must be a finite number (got inf)"


# Every float setting of every section: JSON, which carries a spec to its job, has no infinity.
@pytest.mark.parametrize(
    "key",
    [
        "train.lr", "train.epsilon_high", "eval.temperature", "scales.tiny-s.train.lr",
        "scales.tiny-s.warmstart.lr", "tasks.pyfunc.timeout_s", "policies.lora.alpha",
    ],
)
@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
def test_a_setting_that_is_not_a_finite_number_is_refused(experiment: Path, key: str, value: str) -> None:
    shown = {".inf": "inf", "-.inf": "-inf", ".nan": "nan"}[value]
    assert load_error(experiment, sets=[f"{key}={value}"]) == (
        f"{experiment} with --set '{key}={value}': {key}: must be a finite number (got {shown})"
    )


def test_an_infinite_value_of_an_extra_axis_is_refused(raw: dict) -> None:
    raw["grid"]["train.lr"] = [1.0e-4, float("inf")]
    assert error_of(raw) == "E.yaml: grid.train.lr: must be a finite number (got inf)"


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("train.steps", "true", "train.steps: expected a whole number (got true)"),
        ("train.checkpoint_every", "false", "train.checkpoint_every: expected a whole number (got false)"),
        ("train.lr", "true", "train.lr: expected a number (got true)"),
        ("grid.seed", "[true]", "grid.seed[0]: expected a whole number (got true)"),
        ("grid.seed", "[1, true]", "grid.seed[1]: expected a whole number (got true)"),  # not 'values repeat in [1, 1]'
        ("scales.tiny-s.train.steps", "true", "scales.tiny-s.train.steps: expected a whole number (got true)"),
        ("tasks.arith.n_eval", "true", "tasks.arith.n_eval: expected a whole number (got true)"),
        ("train.kl_beta_roles", "{aggregator: true}", "train.kl_beta_roles.aggregator: expected a number (got true)"),
    ],
)
def test_a_boolean_where_a_number_goes_is_refused(experiment: Path, key: str, value: str, message: str) -> None:
    # pydantic alone takes true as 1: one training step, or seeds [1, 1].
    assert load_error(experiment, sets=[f"{key}={value}"]) == f"{experiment} with --set '{key}={value}': {message}"


def test_a_boolean_among_an_extra_axis_values_is_refused(raw: dict) -> None:
    raw["grid"]["train.steps"] = [4, True]
    assert error_of(raw) == "E.yaml: grid.train.steps: expected a whole number (got true)"


def test_numbers_keep_their_other_spellings(experiment: Path) -> None:
    config = load_config(experiment, sets=["train.steps=4.0", "train.lr='1e-4'", "train.scale_rewards='false'"])
    assert (config.train.steps, config.train.lr, config.train.scale_rewards) == (4, 1e-4, False)


def test_wrong_boolean(raw: dict) -> None:
    raw["train"]["scale_rewards"] = "maybe"
    assert error_of(raw) == "E.yaml: train.scale_rewards: expected true or false (got 'maybe')"


def test_section_that_is_not_a_mapping(raw: dict) -> None:
    raw["grid"] = ["tiny-s"]
    assert error_of(raw) == "E.yaml: grid: expected a mapping of key: value pairs (got a list)"


def test_negative_seed_names_its_position(raw: dict) -> None:
    raw["grid"]["seed"] = [0, -1]
    assert error_of(raw) == "E.yaml: grid.seed[1]: must be greater than or equal to 0 (got -1)"


def test_empty_axis(raw: dict) -> None:
    raw["grid"]["seed"] = []
    assert error_of(raw) == "E.yaml: grid.seed: the list is empty; list at least one value"


def test_missing_grid(raw: dict) -> None:
    del raw["grid"]
    assert error_of(raw) == "E.yaml: grid: required key is missing; add it"


def test_missing_axis(raw: dict) -> None:
    del raw["grid"]["seed"]
    assert error_of(raw) == "E.yaml: grid.seed: required key is missing; add it"


def test_unknown_kind(raw: dict) -> None:
    raw["scales"]["tiny-s"]["kind"] = "huge"
    assert error_of(raw) == "E.yaml: scales.tiny-s.kind: unknown kind 'huge'; use one of: tiny, hf"
    raw["scales"]["tiny-s"]["kind"] = "tiyn"
    assert error_of(raw) == "E.yaml: scales.tiny-s.kind: unknown kind 'tiyn'; did you mean tiny?"


def test_missing_kind(raw: dict) -> None:
    del raw["tasks"]["arith"]["kind"]
    assert error_of(raw) == (
        "E.yaml: tasks.arith.kind: required key is missing; add it (one of: "
        "arith, pyfunc, gsm8k, math, math_generic, humaneval, code_generic)"
    )


def test_cross_field_check(raw: dict) -> None:
    raw["scales"]["tiny-m"]["num_heads"] = 5
    assert error_of(raw) == "E.yaml: scales.tiny-m: hidden_size 192 must be a multiple of num_heads 5"


# --- grid values -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "axis, value, message",
    [
        ("scale", "tiny-xl", "grid.scale: unknown scale 'tiny-xl'; did you mean tiny-s? (or define it under 'scales:')"),
        ("scale", "large", "grid.scale: unknown scale 'large'; use one of: tiny-s, tiny-m or define it under 'scales:'"),
        ("task", "arithm", "grid.task: unknown task 'arithm'; did you mean arith? (or define it under 'tasks:')"),
        ("task", "sorting", "grid.task: unknown task 'sorting'; use one of: arith, pyfunc or define it under 'tasks:'"),
        ("workflow", "votng", "grid.workflow: unknown workflow 'votng'; did you mean voting?"),
        ("workflow", "debate", "grid.workflow: unknown workflow 'debate'; use one of: single, voting, eval_opt, orch_workers"
            "; or, if a plugin defines it, name its module in MATRIXRL_PLUGINS (docs/extending.md)"),
        ("policy", "Isolated", "grid.policy: unknown policy 'Isolated'; did you mean isolated?"),
        ("policy", "separate", "grid.policy: unknown policy 'separate'; use one of: shared, isolated"),
    ],
)
def test_unknown_grid_value_names_axis_and_valid_values(raw: dict, axis: str, value: str, message: str) -> None:
    raw["grid"][axis] = [*raw["grid"][axis], value]
    assert error_of(raw) == f"E.yaml: {message}"


@pytest.mark.parametrize(
    "axis, values, shown",
    [("seed", [0, 1, 0], "[0, 1, 0]"), ("scale", ["tiny-s", "tiny-s"], "['tiny-s', 'tiny-s']")],
)
def test_duplicate_axis_values(raw: dict, axis: str, values: list, shown: str) -> None:
    raw["grid"][axis] = values
    assert error_of(raw) == f"E.yaml: grid.{axis}: values repeat in {shown}; list each once"


# --- the file itself -------------------------------------------------------------------------


def test_yaml_syntax_error_gives_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("results_dir: results\ngrid: [a, b\nscales: {}\n")
    assert load_error(path) == (
        f"{path}: not valid YAML at line 3, column 7: expected ',' or ']', but got ':' "
        "(while parsing a flow sequence that starts at line 2, column 7)"
    )


def test_yaml_unterminated_quote(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text('results_dir: "results\n')
    assert load_error(path) == (
        f"{path}: not valid YAML at line 2, column 1: found unexpected end of stream "
        "(while scanning a quoted scalar that starts at line 1, column 14)"
    )


def test_yaml_tab_indent(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("grid:\n\tseed: [0]\n")
    assert load_error(path) == (
        f"{path}: not valid YAML at line 2, column 1: found character '\\t' that cannot start any token"
    )


@pytest.mark.parametrize("text", ["- grid\n- scales\n", "just text\n", ""])
def test_top_level_not_a_mapping(tmp_path: Path, text: str) -> None:
    path = tmp_path / "list.yaml"
    path.write_text(text)
    assert load_error(path) == (
        f"{path}: expected a mapping of sections (grid:, scales:, ...) at the top level"
    )


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    assert load_error(path) == f"{path}: no such file; pass -c PATH or create experiments.yaml"


def test_directory_instead_of_file(tmp_path: Path) -> None:
    assert load_error(tmp_path) == f"{tmp_path}: cannot read it (Is a directory)"


# --- --set -----------------------------------------------------------------------------------


def test_parse_set_parses_yaml_values() -> None:
    assert parse_set("train.steps=4") == (["train", "steps"], 4)
    assert parse_set("train.lr=1e-3") == (["train", "lr"], "1e-3")  # YAML 1.1: no dot, no float
    assert parse_set("train.lr=1.0e-3") == (["train", "lr"], 1.0e-3)
    assert parse_set("train.scale_rewards=false") == (["train", "scale_rewards"], False)
    assert parse_set("grid.seed=[0,1,2]") == (["grid", "seed"], [0, 1, 2])
    assert parse_set("grid.scale=[tiny-s]") == (["grid", "scale"], ["tiny-s"])
    assert parse_set(" results_dir = out ") == (["results_dir"], "out")
    assert parse_set("results_dir='a=b'") == (["results_dir"], "a=b")
    assert parse_set("train.steps=") == (["train", "steps"], None)


def test_set_creates_nested_sections() -> None:
    raw: dict = {"train": {"steps": 1}}
    apply_set(raw, "scales.tiny-xs.warmstart.steps=10")
    apply_set(raw, "train.lr=0.5")
    assert raw == {"train": {"steps": 1, "lr": 0.5}, "scales": {"tiny-xs": {"warmstart": {"steps": 10}}}}


def test_set_overrides_through_load_config(experiment: Path) -> None:
    cfg = load_config(experiment, sets=["grid.seed=[0,1,2]", "train.steps=4", "scales.tiny-s.warmstart.steps=7"])
    assert cfg.grid.seed == [0, 1, 2]
    assert cfg.train.steps == 4
    assert cfg.scales["tiny-s"].warmstart.steps == 7


def test_set_reaches_a_scale_whose_name_has_a_dot(tmp_path: Path) -> None:
    # examples/paper.yaml's scales are qwen3-0.6b, qwen3-1.7b, qwen3-4b: a pilot on another
    # model sets their path, and the dot in the name is not a level of the config.
    paper = Path(__file__).parent.parent / "examples" / "paper.yaml"
    cfg = load_config(
        paper,
        sets=[f"scales.qwen3-0.6b.path={tmp_path}", "scales.qwen3-0.6b.device=cpu", "grid.scales.qwen3-1.7b.train.lr=[1.0e-5, 2.0e-5]"],
    )
    assert cfg.scales["qwen3-0.6b"].path == str(tmp_path)
    assert cfg.scales["qwen3-0.6b"].device == "cpu"
    assert cfg.scales["qwen3-1.7b"].path == "Qwen/Qwen3-1.7B"
    assert "qwen3-0" not in cfg.scales
    assert cfg.grid.sweeps == {"scales.qwen3-1.7b.train.lr": [1.0e-5, 2.0e-5]}


@pytest.mark.parametrize("bad", ["train.steps", "=4", "train..steps=4", ".steps=4"])
def test_set_without_a_key_or_equals(bad: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_set(bad)
    assert str(info.value) == f"--set {bad!r}: expected dotted.key=VALUE, e.g. --set train.steps=4"


def test_set_invalid_yaml_value() -> None:
    with pytest.raises(ConfigError) as info:
        parse_set("grid.seed=[0,1")
    assert str(info.value) == "--set 'grid.seed=[0,1': the value is not valid YAML; quote it or fix its syntax"


def test_set_below_a_scalar(raw: dict) -> None:
    with pytest.raises(ConfigError) as info:
        apply_set(raw, "train.steps.max=4")
    assert str(info.value) == (
        "--set 'train.steps.max=4': train.steps is a single value, not a section, "
        "so it has no key 'max'; use --set train.steps=VALUE"
    )


def test_set_of_an_unknown_key_is_reported_by_validation(experiment: Path) -> None:
    assert load_error(experiment, sets=["train.stepz=4"]) == (
        f"{experiment} with --set 'train.stepz=4': train.stepz: unknown key; did you mean steps?"
    )
    assert load_error(experiment, sets=["trian.steps=4"]) == (
        f"{experiment} with --set 'trian.steps=4': trian: unknown key; did you mean train?"
    )
    assert load_error(experiment, sets=["train.colour=4"]) == (
        f"{experiment} with --set 'train.colour=4': train.colour: unknown key; valid keys here: {TRAIN_KEYS}"
    )


def test_set_of_a_wrong_type(experiment: Path) -> None:
    assert load_error(experiment, sets=["train.steps=[4]"]) == (
        f"{experiment} with --set 'train.steps=[4]': train.steps: expected an integer (got a list)"
    )
    assert load_error(experiment, sets=["train.steps="]) == (
        f"{experiment} with --set 'train.steps=': train.steps: expected an integer (got an empty value)"
    )


# --- --only ----------------------------------------------------------------------------------


def test_parse_only() -> None:
    assert parse_only("seed=0,1") == ("seed", ["0", "1"])
    assert parse_only(" scale = tiny-m , tiny-s ") == ("scale", ["tiny-m", "tiny-s"])


def test_only_narrows_in_the_given_order_and_parses_seeds(raw: dict) -> None:
    raw["grid"]["seed"] = [0, 1]
    apply_only(raw, "scale=tiny-m")
    apply_only(raw, "seed=1,0")
    assert raw["grid"]["scale"] == ["tiny-m"]
    assert raw["grid"]["seed"] == [1, 0]
    assert all(isinstance(s, int) for s in raw["grid"]["seed"])


def test_only_through_load_config(experiment: Path) -> None:
    cfg = load_config(experiment, sets=["grid.seed=[0,1]"], only=["seed=1", "scale=tiny-s"])
    assert cfg.grid.seed == [1] and cfg.grid.scale == ["tiny-s"]
    assert set(cfg.scales) == {"tiny-s", "tiny-m"}  # definitions stay; only the grid narrows


def test_only_after_set_narrows_the_set_grid(experiment: Path) -> None:
    cfg = load_config(experiment, sets=["grid.seed=[0,1,2,3]"], only=["seed=3,2"])
    assert cfg.grid.seed == [3, 2]


def test_only_unknown_axis() -> None:
    with pytest.raises(ConfigError) as info:
        parse_only("color=red")
    assert str(info.value) == (
        "--only 'color=red': unknown axis 'color'; use one of: workflow, task, scale, policy, seed, "
        "e.g. --only seed=0,1"
    )
    with pytest.raises(ConfigError) as info:
        parse_only("seeds=0")
    assert str(info.value) == "--only 'seeds=0': unknown axis 'seeds'; did you mean seed?"


@pytest.mark.parametrize("bad", ["seed", "seed=", "seed=,", "=0,1"])
def test_only_bad_form(bad: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_only(bad)
    assert str(info.value) == f"--only {bad!r}: {ONLY_FORM}"


def test_only_repeated_value() -> None:
    with pytest.raises(ConfigError) as info:
        parse_only("seed=0,1,0")
    assert str(info.value) == "--only 'seed=0,1,0': 0 given more than once; list each value once"


def test_only_with_two_axes_in_one_option_shows_the_two_options() -> None:
    with pytest.raises(ConfigError) as info:
        parse_only("scale=tiny-s,tiny-m,task=arith,pyfunc")
    assert str(info.value) == (
        "--only 'scale=tiny-s,tiny-m,task=arith,pyfunc': one axis per --only; repeat the option: "
        "--only scale=tiny-s,tiny-m --only task=arith,pyfunc"
    )


@pytest.mark.parametrize(
    "bad, message",
    [
        # Not a second axis (whose values the fix would leave empty): a value holding an '='.
        ("scale=tiny-s=x", "the value tiny-s=x holds an '=' and tiny-s is no axis; give one AXIS=V1,V2 per --only, e.g. --only scale=tiny-s"),
        ("seed==1", "the value =1 holds an '=' and no axis is named before it; give one AXIS=V1,V2 per --only, e.g. --only seed=1"),
        # A second axis without values: the fix is still two valid options.
        ("scale=tiny-s,task=", "one axis per --only; repeat the option: --only scale=tiny-s --only task=V1,V2"),
    ],
)
def test_only_with_a_second_equals_sign_gets_a_fix_that_parses(bad: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_only(bad)
    assert str(info.value) == f"--only {bad!r}: {message}"


def test_only_takes_a_swept_number_as_the_file_spells_it(experiment: Path) -> None:
    # The file says 1.0e-4 and tables say 0.0001: either spelling (or 1e-4) is the value.
    sets = ["grid.train.lr=[1.0e-4, 5.0e-5]"]
    for spelling in ("1.0e-4", "1e-4", "0.0001", "10e-5"):
        assert load_config(experiment, sets=sets, only=[f"train.lr={spelling}"]).grid.sweeps == {"train.lr": [1.0e-4]}
    assert load_config(experiment, sets=sets, only=["train.lr=5.0e-5,1e-4"]).grid.sweeps == {"train.lr": [5.0e-5, 1.0e-4]}
    assert load_error(experiment, sets=sets, only=["train.lr=1e-4,0.0001"]) == (
        "--only 'train.lr=1e-4,0.0001': 0.0001 is another spelling of a value given before; list each value once"
    )
    assert load_error(experiment, sets=sets, only=["train.lr=2e-4"]) == (
        "--only 'train.lr=2e-4': 2e-4 not in grid.train.lr [0.0001, 5e-05]; --only narrows the grid, "
        "use --set grid.train.lr=[...] to change it"
    )


def test_only_value_not_in_grid(raw: dict) -> None:
    with pytest.raises(ConfigError) as info:
        apply_only(raw, "seed=0,5")
    assert str(info.value) == (
        "--only 'seed=0,5': 5 not in grid.seed [0]; --only narrows the grid, "
        "use --set grid.seed=[...] to change it"
    )


def test_only_value_not_in_grid_through_load_config(experiment: Path) -> None:
    assert load_error(experiment, only=["scale=large,tiny-s"]) == (
        "--only 'scale=large,tiny-s': large not in grid.scale [tiny-s, tiny-m]; "
        "--only narrows the grid, use --set grid.scale=[...] to change it"
    )


def test_only_value_near_a_grid_value_suggests_it(experiment: Path) -> None:
    assert load_error(experiment, only=["scale=tiny-x"]) == (
        "--only 'scale=tiny-x': tiny-x not in grid.scale; did you mean tiny-s? (or --set grid.scale=[...] to change the grid)"
    )
    # not a value already given, and never a number: seed 10 is another seed, not a slip of 0 or 1
    assert load_error(experiment, only=["scale=tiny-s,tiny-mm"]).startswith(
        "--only 'scale=tiny-s,tiny-mm': tiny-mm not in grid.scale; did you mean tiny-m?"
    )
    assert load_error(experiment, sets=["grid.seed=[0, 1]"], only=["seed=10"]) == (
        "--only 'seed=10': 10 not in grid.seed [0, 1]; --only narrows the grid, use --set grid.seed=[...] to change it"
    )


def test_every_axis_can_be_narrowed(raw: dict) -> None:
    for axis in AXES:
        first = raw["grid"][axis][0]
        narrowed = copy.deepcopy(raw)
        apply_only(narrowed, f"{axis}={first}")
        assert narrowed["grid"][axis] == [first]


def test_too_few_distinct_problems_for_the_eval_set(experiment: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(experiment, sets=["tasks.arith.terms=2"])
    assert str(caught.value) == (
        f"{experiment} with --set 'tasks.arith.terms=2': tasks.arith: n_eval 256 leaves too few training problems: digits=1, "
        "terms=2 give 100 distinct problems; keep n_eval at most 50 or raise digits or terms"
    )


# --- evaluation and per-scale training settings -----------------------------------------------


def test_greedy_evaluation_takes_one_sample_unless_told_otherwise(raw: dict) -> None:
    raw["eval"] = {"temperature": 0}
    assert validate(raw, "E.yaml").eval.samples == 1
    raw["eval"] = {"temperature": 0.7}
    assert validate(raw, "E.yaml").eval.samples == 2
    raw["eval"] = {"temperature": 0, "samples": 3}
    assert error_of(raw) == (
        "E.yaml: eval: samples 3 with temperature 0: greedy decoding gives identical completions; "
        "use samples: 1, or a temperature above 0"
    )


def test_the_base_is_read_with_four_times_the_samples_unless_told_otherwise(raw: dict) -> None:
    """And the base evaluation alone reads them: its digest moves with the samples it takes, a checkpoint's does not."""
    from matrixrl import grid as G

    raw["eval"] = {"temperature": 0}
    assert validate(raw, "E.yaml").eval.base_samples_in_effect == 1
    specs = {}
    for base_samples in (None, 12, 5):
        raw["eval"] = {"temperature": 0.7, "samples": 3, "base_samples": base_samples}
        config = validate(raw, "E.yaml")
        specs[base_samples] = G.cell_spec(config, G.cells(config)[0])
    assert [G.base_eval_spec(spec).eval.samples for spec in specs.values()] == [12, 12, 5]
    assert G.base_eval_digest(specs[None]) == G.base_eval_digest(specs[12]) != G.base_eval_digest(specs[5])
    assert len({spec.eval_digest() for spec in specs.values()}) == 1
    raw["eval"] = {"temperature": 0, "base_samples": 4}
    assert error_of(raw) == (
        "E.yaml: eval: base_samples 4 with temperature 0: greedy decoding gives identical completions; "
        "use base_samples: 1, or a temperature above 0"
    )


def test_a_scales_own_training_settings_are_checked_like_train(raw: dict) -> None:
    raw["scales"]["tiny-m"]["train"] = {"lr": -1}
    assert error_of(raw) == "E.yaml: scales.tiny-m.train.lr: must be greater than 0 (got -1)"
    raw["scales"]["tiny-m"]["train"] = {"rate": 1e-4}
    assert error_of(raw).startswith("E.yaml: scales.tiny-m.train.rate: unknown key; valid keys here: steps, eval_every, ")
