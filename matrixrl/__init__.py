"""matrixrl: experiment matrices for RL training of multi-agent LLM workflows."""

__version__ = "0.1.0"
