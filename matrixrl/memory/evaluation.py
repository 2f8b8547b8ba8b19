"""The memory specs that need the grid's: a cell's evaluation under a memory mode, the memory plan.

The memory plan is matrixrl.memory.specs' with the models as the grid digests them."""

from __future__ import annotations

import functools
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

from matrixrl import layout as L
from matrixrl.config import Config
from matrixrl.grid import CellSpec, base_eval_digest, memory_model
from matrixrl.memory.specs import BankSpec, MemoryPlan, Retrieval, bank_name, memory_eval_digest, memory_plan


def plan_memory(config: Config, training: Iterable[tuple[str, str, str]] = ()) -> MemoryPlan:
    """:func:`matrixrl.memory.specs.memory_plan` of ``config``, its models as the grid digests them."""
    return memory_plan(config, training, ref=functools.partial(memory_model, config))


class MemoryEvalSpec(BaseModel):
    """A cell's evaluation under a memory mode: the cell's spec, the bank it reads, how it retrieves."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cell: CellSpec
    mode: str
    bank: BankSpec
    retrieval: Retrieval

    def digest(self) -> str:
        """A checkpoint's evaluation under this memory."""
        return memory_eval_digest(self.cell.eval_digest(), self.mode, self.bank, self.retrieval)

    def base_digest(self) -> str:
        """The base model's (step 0), shared by every cell of the base evaluation (grid.base_eval_science)."""
        return memory_eval_digest(base_eval_digest(self.cell), self.mode, self.bank, self.retrieval)


def memory_evals(config: Config, specs: dict[str, CellSpec], plan: MemoryPlan) -> dict[tuple[str, str], MemoryEvalSpec]:
    """Each run's evaluation spec under each memory mode, by (cell id, mode), in grid order."""
    found = {}
    memory = config.memory
    for cell_id, spec in specs.items():
        for mode in plan.modes:
            bank = bank_name(mode, spec.cell.scale, memory.weak, memory.strong)
            found[(cell_id, mode)] = MemoryEvalSpec(
                cell=spec, mode=mode, bank=plan.banks[L.bank_result(spec.cell.task, bank)], retrieval=plan.retrieval
            )
    return found
