"""Policies: which trainable parameters answer for which role.

``shared`` routes every role to one model and one parameter set. The interface is
per role (``model_for``, ``parameter_sets``) so that ``isolated`` — one set per
role, each with its own optimizer — slots in beside it.
"""

from __future__ import annotations

from pathlib import Path


class SharedPolicy:
    """Every role's turns update one set of trainable parameters."""

    mode = "shared"

    def __init__(self, model, roles: tuple[str, ...]):
        self.model = model
        self.roles = roles

    def model_for(self, role: str):
        return self.model

    def parameter_sets(self) -> dict[str, tuple[tuple[str, ...], list]]:
        """Name → (roles it serves, trainable parameters); one optimizer per set."""
        return {"shared": (self.roles, [p for p in self.model.parameters() if p.requires_grad])}

    def train(self, mode: bool = True) -> None:
        self.model.train(mode)

    def save(self, folder: Path) -> None:
        self.model.save_pretrained(folder / "shared")

    @classmethod
    def load(cls, folder: Path, roles: tuple[str, ...]) -> "SharedPolicy":
        return cls(load_causal_lm(folder / "shared"), roles)


def load_causal_lm(folder: Path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype="float32")
    model.eval()
    return model


POLICIES = {"shared": SharedPolicy}


def build_policy(mode: str, model, roles: tuple[str, ...]):
    return POLICIES[mode](model, roles)


def load_policy(mode: str, folder: Path, roles: tuple[str, ...]):
    return POLICIES[mode].load(folder, roles)
