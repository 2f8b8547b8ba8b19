"""Snakemake profiles as matrixrl reads them: their options, each rule's resources, local or cluster."""

from __future__ import annotations

import pkgutil
from pathlib import Path

import yaml

from matrixrl.errors import ProfileError, did_you_mean
from matrixrl.dag import LOCAL_RULES

_LOCAL_EXECUTORS = {"local", "dryrun", "touch"}


def profile_config(profile: Path) -> dict:
    """A Snakemake profile's config.yaml, read for `plan` (Snakemake itself reads it for `run`)."""
    path = profile / "config.yaml"
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ProfileError(f"--profile {profile}: no config.yaml in it; see profiles/slurm/ for an example")
    except UnicodeDecodeError as exc:
        raise ProfileError(f"{path}: not UTF-8 text (byte {exc.start}); save it as UTF-8")
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: not valid YAML ({getattr(exc, 'problem', exc)}); fix its syntax")
    if not isinstance(raw, dict):
        raise ProfileError(f"{path}: expected a mapping of Snakemake options")
    _check_options(raw, path)
    return raw


# Snakemake's options whose values matrixrl can check before Snakemake starts (a bad one would
# fail `run` only after results/ is made, with nothing but Snakemake's log to say why):
# (what the value must be, an example; the words a value may be instead).
_COUNTS = {
    "jobs": (1, ("unlimited",), 50), "cores": (1, ("all",), 4), "local-cores": (1, (), 4),
    "latency-wait": (0, (), 60), "restart-times": (0, (), 1), "retries": (0, (), 1),
}
_RATES = ("max-jobs-per-second", "max-status-checks-per-second", "seconds-between-status-checks")


def _check_options(raw: dict, path: Path) -> None:
    """A ProfileError naming the first option of ``raw`` whose value Snakemake would refuse:
    a count that is no whole number (``jobs: abc``), a rate that is no number. (An executor
    whose plugin is not installed here is :func:`check_executor`'s: a plan may be previewed
    where the run will not be.)"""
    for key, value in raw.items():
        option = str(key).replace("_", "-")  # Snakemake takes either spelling
        if option in _COUNTS:
            least, words, example = _COUNTS[option]
            whole = isinstance(value, int) and not isinstance(value, bool)
            if value in words or (whole and value >= least):
                continue
            also = "".join(f" or {word}" for word in words)
            raise ProfileError(
                f"{path}: {key}: expected a whole number of at least {least}{also} (got {_shown(value)}); e.g. {key}: {example}"
            )
        if option in _RATES and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
            raise ProfileError(f"{path}: {key}: expected a number above 0 (got {_shown(value)}); e.g. {key}: 10")


def check_executor(profile: Path) -> None:
    """A ProfileError when ``profile`` names an executor whose plugin is not installed, before a
    run makes anything (Snakemake would stop with it only in its own log)."""
    raw = profile_config(profile)
    for key, value in raw.items():
        if str(key).replace("_", "-") != "executor":
            continue
        executor, plugins = str(value), executor_plugins()
        if executor not in _LOCAL_EXECUTORS and executor not in plugins:
            fix = did_you_mean(executor, [*sorted(_LOCAL_EXECUTORS), *plugins])
            raise ProfileError(
                f"{profile / 'config.yaml'}: executor: {executor!r} is no installed Snakemake executor; {fix} "
                f"(or pip install snakemake-executor-plugin-{executor})"
            )


def _shown(value) -> str:
    """A YAML value as the file spells it (true, not Python's True)."""
    return yaml.safe_dump(value, default_flow_style=True).removesuffix("\n...\n").strip() if isinstance(value, bool) or value is None else repr(value)


def executor_plugins() -> list[str]:
    """The Snakemake executor plugins installed (``slurm`` for snakemake_executor_plugin_slurm),
    found by their module names as Snakemake finds them, without importing them."""
    prefix = "snakemake_executor_plugin_"
    return sorted(
        module.name[len(prefix):].replace("_", "-") for module in pkgutil.iter_modules() if module.name.startswith(prefix)
    )


def _as_mapping(value, where: str) -> dict:
    """Profile resources come as a mapping or as a list of ``key=value`` strings."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):
        pairs = {}
        for item in value:
            key, sep, val = str(item).partition("=")
            if not sep:
                raise ProfileError(f"{where}: {item!r} is not key=value")
            pairs[key.strip()] = yaml.safe_load(val)
        return pairs
    raise ProfileError(f"{where}: expected a mapping or a list of key=value")


def rule_resources(profile: Path, rules: list[str]) -> dict[str, dict]:
    """Resources each rule will request under ``profile`` (defaults, then per-rule settings)."""
    raw = profile_config(profile)
    path = profile / "config.yaml"
    defaults = _as_mapping(raw.get("default-resources"), f"{path}: default-resources")
    per_rule = raw.get("set-resources") or {}
    if isinstance(per_rule, list):  # ["train:mem_mb=4000", ...]
        grouped: dict[str, dict] = {}
        for item in per_rule:
            rule, _, pair = str(item).partition(":")
            grouped.setdefault(rule, {}).update(_as_mapping([pair], f"{path}: set-resources"))
        per_rule = grouped
    threads = raw.get("set-threads") or {}
    local = set(LOCAL_RULES)
    table = {}
    for rule in rules:
        if rule in local:
            table[rule] = {"host": "local"}
            continue
        resources = {**defaults, **_as_mapping(per_rule.get(rule), f"{path}: set-resources.{rule}")}
        if rule in threads:
            resources["threads"] = threads[rule]
        table[rule] = resources
    return table


def cluster_executor(profile: str | Path | None) -> str | None:
    """The executor of a profile that sends jobs to a cluster (``slurm``); None without a
    profile or for a local one. Raises ProfileError for a profile that cannot be read."""
    if profile is None:
        return None
    executor = str(profile_config(Path(profile)).get("executor", "local"))
    return None if executor in _LOCAL_EXECUTORS else executor


def is_cluster_profile(profile: str | None) -> bool:
    """Whether a profile sends jobs to a cluster executor (they are no processes of this machine)."""
    try:
        return cluster_executor(profile) is not None
    except ProfileError:
        return False


def partitions(profile: Path) -> dict[str, list[str]]:
    """The SLURM partitions a profile sends jobs to (``slurm_partition``), each with the rules
    that name it: ``default`` for ``default-resources``, then each rule of ``set-resources``
    that names another."""
    raw = profile_config(profile)
    default = _as_mapping(raw.get("default-resources"), f"{profile / 'config.yaml'}: default-resources")
    per_rule = raw.get("set-resources") or {}
    rules = list(per_rule) if isinstance(per_rule, dict) else [str(item).partition(":")[0] for item in per_rule]
    found: dict[str, list[str]] = {}
    if default.get("slurm_partition") is not None:
        found[str(default["slurm_partition"])] = ["default"]
    for rule, resources in rule_resources(profile, list(dict.fromkeys(rules))).items():
        partition = resources.get("slurm_partition")
        if partition is not None and partition != default.get("slurm_partition"):
            found.setdefault(str(partition), []).append(rule)
    return found


def check_profile(profile: Path) -> Path:
    """``profile`` if it is a folder with a readable ``config.yaml`` mapping; else a one-line ProfileError."""
    if Path(profile).exists() and not Path(profile).is_dir():
        if Path(profile).name == "config.yaml":  # the profile's own file: its folder was meant
            raise ProfileError(f"--profile {profile}: is a file; pass the folder that holds it: --profile {Path(profile).parent}")
        experiments = " (an experiments file goes to -c)" if Path(profile).suffix in (".yaml", ".yml") else ""
        raise ProfileError(
            f"--profile {profile}: is a file, not a profile; a profile is a folder holding config.yaml, "
            f"such as profiles/slurm{experiments}"
        )
    if not Path(profile).is_dir():
        raise ProfileError(f"--profile {profile}: no such folder; pass a Snakemake profile folder such as profiles/slurm")
    profile_config(Path(profile))
    return Path(profile)
