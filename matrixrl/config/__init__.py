"""experiments.yaml: its schema, reading it with overrides, and one-line errors.

experiments.yaml holds the science: the grid's axes and the settings that define
what a cell computes. Runtime matters (cores, cluster, profile) never live here.
Every model forbids unknown keys, and every error names its key path.

- :mod:`matrixrl.config.schema`: the sections' models (``Config`` and below); a task
  kind's settings come from its task module, a workflow's from its workflow module;
- :mod:`matrixrl.config.load`: ``load_config`` (YAML, ``--set``, ``--only``, paths
  resolved and checked) and ``validate``;
- :mod:`matrixrl.config.messages`: a pydantic error as one line;
- :mod:`matrixrl.config.reference`: ``python -m matrixrl.config.reference`` writes
  docs/config-reference.md, every setting with its type, default and description.

``Strict``, ``RUNTIME`` and ``science`` live in :mod:`matrixrl.settings`
and errors in :mod:`matrixrl.errors`; both are re-exported here for existing callers.
"""

from matrixrl.config.load import apply_only, apply_set, load_config, parse_only, parse_set, validate
from matrixrl.config.schema import (
    ANSWER_ROLES,
    AXES,
    MEMORY_MODES,
    POLICIES,
    WORKFLOWS,
    Analysis,
    Config,
    Evaluate,
    Grid,
    HfScale,
    LoraSettings,
    Memory,
    Policies,
    Scale,
    TaskConfig,
    TinyScale,
    Train,
    TrainOverrides,
    WarmStart,
    Workflows,
)
from matrixrl.errors import ConfigError
from matrixrl.settings import RUNTIME, Strict, is_runtime, science
from matrixrl.workflows.styles import PromptSettings

__all__ = [
    "ANSWER_ROLES",
    "AXES",
    "MEMORY_MODES",
    "POLICIES",
    "RUNTIME",
    "WORKFLOWS",
    "Analysis",
    "Config",
    "ConfigError",
    "Evaluate",
    "Grid",
    "HfScale",
    "LoraSettings",
    "Memory",
    "Policies",
    "PromptSettings",
    "Scale",
    "Strict",
    "TaskConfig",
    "TinyScale",
    "Train",
    "TrainOverrides",
    "WarmStart",
    "Workflows",
    "apply_only",
    "apply_set",
    "is_runtime",
    "load_config",
    "parse_only",
    "parse_set",
    "science",
    "validate",
]
