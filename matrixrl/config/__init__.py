"""experiments.yaml: its schema, reading it with overrides, and one-line errors.

``schema``, ``load`` and ``messages``; ``Strict``, ``RUNTIME``, ``science`` and the errors are re-exported.
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
