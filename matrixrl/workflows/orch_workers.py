"""``orch_workers``: an orchestrator proposes N strategies, N workers solve, a synthesizer decides.

Stages, each one batched call: the ``orchestrator`` answers, parsed into exactly ``n_workers``
strategies; a ``worker`` per strategy and episode (agent-major order); the ``synthesizer`` reads
the workers' completions and answers. Turns: ``orchestrator0``, ``worker0..N-1``, ``synthesizer0``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from matrixrl.tasks.base import Problem
from matrixrl.workflows.base import Episode, Generate, Turn, WorkflowBase, WorkflowSettings, decide, parallel_turns
from matrixrl.workflows.styles.compact import noisy_candidates, pick_target

if TYPE_CHECKING:
    import numpy as np


class Settings(WorkflowSettings):
    n_workers: int = Field(3, ge=2, description="parallel worker agents (and strategies) per episode")


class OrchWorkers(WorkflowBase):
    name = "orch_workers"
    description = "an orchestrator proposes strategies, parallel workers solve, a synthesizer picks"
    roles = ("orchestrator", "worker", "synthesizer")
    parallel_roles = ("worker",)
    settings_model = Settings

    def run(self, problems: list[Problem], groups: list[int], generate: Generate) -> list[Episode]:
        style, n, size = self.style, self.settings.n_workers, len(problems)
        plan_prompts = [style.orchestrator(p, n) for p in problems]
        plans = generate("orchestrator", plan_prompts)
        strategies = [style.parse_strategies(c.text, n) for c in plans]
        work_prompts = [style.worker(problems[i], strategies[i][a]) for a in range(n) for i in range(size)]
        answers = generate("worker", work_prompts)
        workers = parallel_turns("worker", work_prompts, answers, size, n, style.answer)
        episodes = [
            Episode(problem=p, group=g, turns=[Turn("orchestrator", "orchestrator0", 0, plan_prompts[i], plans[i]), *workers[i]])
            for i, (p, g) in enumerate(zip(problems, groups))
        ]
        synth_prompts = [style.synthesizer(e.problem, [t.completion.text for t in e.turns[1:]]) for e in episodes]
        decide(episodes, "synthesizer", synth_prompts, generate, style.answer)
        return episodes

    def _random_strategies(self, rng: np.random.Generator) -> list[str]:
        vocab = list(self.style.strategies)
        n = self.settings.n_workers
        picks = rng.choice(len(vocab), size=n, replace=n > len(vocab))
        return [vocab[int(k)] for k in picks]

    def warmstart_pairs(self, problems: list[Problem], rng: np.random.Generator) -> list[tuple[str, str]]:
        """Per problem: random strategies, a worker's right answer under one, a synthesizer choice."""
        style, others = self.style, [p.answer for p in problems]
        pairs = []
        for p in problems:
            strategies = self._random_strategies(rng)
            candidates = noisy_candidates(p.answer, self.settings.n_workers, rng, others)
            pairs += [
                (style.orchestrator(p, self.settings.n_workers), style.format_strategies(strategies)),
                (style.worker(p, strategies[int(rng.integers(len(strategies)))]), style.target(p.answer)),
                (style.synthesizer(p, [style.target(c) for c in candidates]), style.target(pick_target(candidates, p.answer))),
            ]
        return pairs
