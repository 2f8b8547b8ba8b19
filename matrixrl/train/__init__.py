"""Training: one cell's GRPO loop, its rollouts, rewards, loss, diagnostics and checkpoints."""
