"""Policies: which trainable parameters answer for which role.

``shared``: one parameter set for every role; ``isolated``: one per role, with its own optimizer.
docs/design.md §1.
"""

from __future__ import annotations

import contextlib
import copy
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path

from matrixrl.models.hf import ModelSource, load_causal_lm

SHARED = "shared"

__all__ = ["SHARED", "Policy", "FullPolicy", "LoraPolicy", "build_policy", "load_policy", "load_causal_lm"]


def _lora_config(settings):
    from peft import LoraConfig

    lora = settings.lora
    return LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        bias="none",
    )


class Policy(ABC):
    """Routes roles to models and names the parameter sets the trainer steps."""

    def __init__(self, mode: str, roles: tuple[str, ...], settings):
        self.mode = mode
        self.roles = tuple(roles)
        self.settings = settings

    def set_names(self) -> tuple[str, ...]:
        return (SHARED,) if self.mode == SHARED else self.roles

    def set_of(self, role: str) -> str:
        return SHARED if self.mode == SHARED else role

    @abstractmethod
    def model_for(self, role: str): ...

    @abstractmethod
    def reference(self) -> contextlib.AbstractContextManager:
        """A context in which the yielded model computes as the base model did (the KL anchor's reference)."""

    @abstractmethod
    def parameters_of(self, name: str) -> list: ...

    @abstractmethod
    def save(self, folder: Path) -> None: ...

    def parameter_sets(self) -> dict[str, tuple[tuple[str, ...], list]]:
        """Name → (roles it serves, its trainable parameters); one optimizer per set."""
        return {
            name: (tuple(r for r in self.roles if self.set_of(r) == name), self.parameters_of(name))
            for name in self.set_names()
        }

    def train(self, mode: bool = True) -> None:
        for model in self._models():
            model.train(mode)

    def enable_gradient_checkpointing(self) -> None:
        """Recompute activations in the backward pass (in train mode only: rollouts, in eval
        mode, keep their KV cache). Non-reentrant, so a frozen LoRA base needs no input grads."""
        for model in self._models():
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    @property
    def device(self):
        """Where the policy's models live (every parameter set is on one device)."""
        return next(self._models()[0].parameters()).device

    @abstractmethod
    def _models(self) -> list: ...


class FullPolicy(Policy):
    """Whole models: one (shared) or one copy per role (isolated)."""

    def __init__(self, mode, roles, settings, models: dict):
        super().__init__(mode, roles, settings)
        self.models = models

    @classmethod
    def from_base(cls, mode, base, roles, settings):
        names = (SHARED,) if mode == SHARED else tuple(roles)
        # The first set takes the loaded model itself; the others are copies of it.
        models = {name: base if i == 0 else copy.deepcopy(base) for i, name in enumerate(names)}
        return cls(mode, roles, settings, models)

    def model_for(self, role):
        return self.models[self.set_of(role)]

    def attach_reference(self, base) -> None:
        """Keep ``base`` (a fresh load of the base model) frozen as the reference."""
        base.requires_grad_(False)
        base.eval()
        self.reference_model = base

    @contextlib.contextmanager
    def reference(self) -> Iterator:
        model = getattr(self, "reference_model", None)
        if model is None:
            raise RuntimeError("no reference attached: CellParts builds the policy with reference=True for the KL anchor")
        yield model

    def parameters_of(self, name):
        return [p for p in self.models[name].parameters() if p.requires_grad]

    def _models(self):
        return list(self.models.values())

    def save(self, folder: Path) -> None:
        for name, model in self.models.items():
            model.save_pretrained(folder / name)

    @classmethod
    def load(cls, mode, folder: Path, roles, settings, source: ModelSource):
        names = (SHARED,) if mode == SHARED else tuple(roles)
        return cls(mode, roles, settings, {name: source.load_model(folder / name) for name in names})


class LoraPolicy(Policy):
    """LoRA adapters on one frozen base: one adapter (shared) or one per role (isolated)."""

    def __init__(self, mode, roles, settings, model=None):
        super().__init__(mode, roles, settings)
        self.model = model  # a PeftModel holding every adapter
        self._active = None

    @classmethod
    def from_base(cls, mode, base, roles, settings):
        from peft import get_peft_model

        policy = cls(mode, roles, settings)
        names = policy.set_names()
        model = get_peft_model(base, _lora_config(settings), adapter_name=names[0])
        for name in names[1:]:
            model.add_adapter(name, _lora_config(settings))
        policy.model = model
        return policy

    def model_for(self, role):
        name = self.set_of(role)
        if self._active != name:
            # set_adapter also makes only this adapter trainable: other roles get no gradient.
            self.model.set_adapter(name)
            self._active = name
        return self.model

    @contextlib.contextmanager
    def reference(self) -> Iterator:
        with self.model.disable_adapter():  # the frozen base under the adapters: no second copy
            yield self.model

    def parameters_of(self, name):
        marker = f".{name}."
        return [p for n, p in self.model.named_parameters() if "lora_" in n and marker in n]

    def _models(self):
        return [self.model]

    def save(self, folder: Path) -> None:
        for name in self.set_names():
            self.model.save_pretrained(folder / "lora", selected_adapters=[name])

    @classmethod
    def load(cls, mode, folder: Path, roles, settings, source: ModelSource):
        from peft import PeftModel

        policy = cls(mode, roles, settings)
        names = policy.set_names()
        model = PeftModel.from_pretrained(
            source.load_model(frozen=True), _adapter_dir(folder, names[0]), adapter_name=names[0], is_trainable=True
        )
        for name in names[1:]:
            model.load_adapter(_adapter_dir(folder, name), adapter_name=name, is_trainable=True)
        model.eval()
        policy.model = model
        return policy


def _adapter_dir(folder: Path, name: str) -> Path:
    # PEFT saves a non-"default" adapter in a subfolder named after it.
    return folder / "lora" / name


def _policy_class(adapter: str) -> type[Policy]:
    return FullPolicy if adapter == "full" else LoraPolicy


def build_policy(mode: str, base_model, roles: tuple[str, ...], settings) -> Policy:
    return _policy_class(settings.adapter).from_base(mode, base_model, roles, settings)


def load_policy(mode: str, folder: Path, roles: tuple[str, ...], settings, source: ModelSource) -> Policy:
    """The policy saved in checkpoint ``folder``, on the base model ``source`` describes."""
    return _policy_class(settings.adapter).load(mode, folder, roles, settings, source)
