"""The library versions matrixrl needs: pyproject.toml states them, decoding refuses a
transformers (or a model) that drops the KV cache, and the refusal is one line with the fix."""

from __future__ import annotations

import tomllib

import pytest
import torch
from packaging.requirements import Requirement

from conftest import REPO
from matrixrl.config import TinyScale
from matrixrl.models import versions
from matrixrl.models.tiny import build_char_tokenizer, build_tiny_model
from matrixrl.models.versions import REQUIRED, LibraryVersionError
from matrixrl.train.rollout import decode, make_generate
from matrixrl.train.samplers import greedy_chooser

TINY = TinyScale(kind="tiny", hidden_size=32, num_layers=2, intermediate_size=64, num_heads=2, num_kv_heads=1)
OLD = "5.17.0"  # a version a GPU node's preinstalled image may hold
WHY = ("5.24 is the first whose models take the KV cache as `cache=` (older ones ignore the argument, "
       "and rollouts decode without their cache)")  # fmt: skip


class OnePolicy:
    def __init__(self, model):
        self.model = model

    def model_for(self, role):
        return self.model


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture
def dropping_model(tokenizer, monkeypatch):
    """A tiny model whose forward drops ``cache=`` (what transformers before 5.24 did): it
    builds a cache of its own, and the one it was given stays empty."""
    model = build_tiny_model(TINY, tokenizer, seed=0)
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda *args, cache=None, **kwargs: forward(*args, **kwargs))
    return model


def pyproject_requirements() -> dict[str, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    found = {}
    for line in project["dependencies"] + [d for extra in project["optional-dependencies"].values() for d in extra]:
        requirement = Requirement(line)
        found[requirement.name] = str(requirement.specifier)
    return found


def test_pyproject_states_every_required_range():
    stated = pyproject_requirements()
    for name, (spec, _) in REQUIRED.items():
        assert str(Requirement(f"{name}{spec}").specifier) == stated[name], name


def test_the_installed_libraries_meet_their_requirements():
    assert [versions.outside(name) for name in REQUIRED] == [None] * len(REQUIRED)


def test_a_version_below_or_above_the_range_is_named_with_its_reason():
    assert versions.outside("transformers", OLD) == f"transformers {OLD} is outside matrixrl's requirement >=5.24,<6: {WHY}"
    assert versions.outside("transformers", "6.0.0").startswith("transformers 6.0.0 is outside")
    assert versions.outside("transformers", "5.24.0") is None


def test_generation_refuses_an_older_transformers_before_decoding(tokenizer, monkeypatch):
    monkeypatch.setattr(versions, "installed_version", lambda name: OLD)
    model = build_tiny_model(TINY, tokenizer, seed=0)
    with pytest.raises(LibraryVersionError) as refused:
        make_generate(OnePolicy(model), tokenizer, max_new_tokens=4, temperature=1.0, sample=False)
    assert str(refused.value) == (
        f"transformers {OLD} is outside matrixrl's requirement >=5.24,<6: {WHY}; fix: pip install 'transformers>=5.24,<6'"
    )


def test_a_forward_that_drops_the_cache_is_refused_with_the_version_and_the_fix(tokenizer, dropping_model, monkeypatch):
    """The guard reads what the cache holds, so it fires whatever the version says: here the
    installed version is old, as on a --no-deps install, and decode is called directly."""
    monkeypatch.setattr(versions, "installed_version", lambda name: OLD)
    ids = torch.tensor([tokenizer.encode("12+3=")])
    with pytest.raises(LibraryVersionError) as refused:
        decode(dropping_model, ids, torch.ones_like(ids), None, max_new_tokens=3, eos=tokenizer.eos_token_id,
               pad=tokenizer.pad_token_id, choose=greedy_chooser())  # fmt: skip
    assert str(refused.value) == (
        f"refusing to decode: the model kept 0 of {ids.shape[1]} positions in the KV cache passed as `cache=`, so every "
        f"token would be decoded without its context; transformers {OLD} is outside matrixrl's requirement >=5.24,<6: "
        f"{WHY}; fix: pip install 'transformers>=5.24,<6'"
    )


def test_a_model_of_its_own_that_drops_the_cache_is_refused_under_a_good_version(tokenizer, dropping_model):
    """Prompts that repeat are prefilled once (prompt_cache), which checks its cache too."""
    generate = make_generate(OnePolicy(dropping_model), tokenizer, max_new_tokens=3, temperature=1.0, sample=False)
    with pytest.raises(LibraryVersionError) as refused:
        generate("solver", ["12+3=", "12+3="])
    version = versions.installed_version("transformers")
    assert str(refused.value) == (
        f"refusing to decode: the model kept 0 of 4 positions in the KV cache passed as `cache=`, so every token would "
        f"be decoded without its context; transformers {version} is within the requirement, so the model's own forward "
        "drops the argument; fix: use a model class that accepts `cache=` (transformers' own, not remote code written "
        "for older versions)"
    )


def test_a_model_that_keeps_its_cache_decodes(tokenizer):
    model = build_tiny_model(TINY, tokenizer, seed=0)
    generate = make_generate(OnePolicy(model), tokenizer, max_new_tokens=3, temperature=1.0, sample=False)
    first, again, other = generate("solver", ["12+3=", "12+3=", "7*2="])  # the repeated prompt is prefilled once
    assert first.completion_ids == again.completion_ids and 1 <= len(first.completion_ids) <= 3
    assert 1 <= len(other.completion_ids) <= 3
