"""bench/gpu_smoke.py, the GPU smoke test, runs on CPU with its tiny chat model: every
workflow × policy × adapter trains two steps and is evaluated, and what needs CUDA says it
was skipped. docs/performance.md, "GPU smoke test"."""

from __future__ import annotations

import re

import pytest

from matrixrl.workflows import WORKFLOWS


def test_every_case_trains_and_evaluates_on_cpu(run_bench):
    lines = run_bench("gpu_smoke.py", "--device", "cpu")
    cases = [(w, p, a) for w in WORKFLOWS for p in ("shared", "isolated") for a in ("full", "lora")]
    assert lines[-1] == f"all {len(cases)} cases passed"
    assert sum("skipped in every case" in line for line in lines) == 1  # said once
    rows = {" ".join(line.split()[:3]): line for line in lines if line.split()[:3] and tuple(line.split()[:3]) in cases}
    assert len(rows) == len(cases)
    for case, row in rows.items():
        assert row.endswith(" ok"), row
        changed, tensors = map(int, re.search(r"(\d+)/(\d+) tensors", row).groups())
        assert changed == tensors > 0, row  # every trained tensor moved
        assert ("base same" in row) == case.endswith("lora"), row
        assert row.count("skipped/") == 2 and "n/a (CPU)" in row, row  # memory peaks and MFU need CUDA
        fields = row.split()
        gap = float(fields[next(i for i, f in enumerate(fields) if f.startswith("skipped/")) - 1])
        assert 0 <= gap < 0.5, row  # the log-prob gap (its largest), the column before the memory columns


def test_a_case_whose_parameters_stay_put_fails(run_bench, monkeypatch, capsys):
    """An update that moves nothing (learning rate 0): the case fails, named, and the exit status is 1."""
    import matrixrl.train.trainer as trainer

    make = trainer.make_optimizers
    monkeypatch.setattr(trainer, "make_optimizers", lambda policy, cfg: make(policy, cfg.model_copy(update={"lr": 0.0})))
    with pytest.raises(SystemExit) as exc:
        run_bench("gpu_smoke.py", "--device", "cpu", "--only", "single shared full")
    assert exc.value.code == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[-3].endswith(" FAILED") and "0/25 tensors" in lines[-3], lines
    assert lines[-2:] == ["1 of 1 cases failed:", "  single shared full: parameter sets shared did not change"]


class Forgetful:
    """A model whose forward drops ``cache=``, as transformers before 5.24 did."""

    def __init__(self, model):
        self.model = model

    def __call__(self, *args, cache=None, **kwargs):
        return self.model(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.model, name)


def test_a_rollout_that_decodes_without_its_cache_fails_on_the_gap(run_bench, monkeypatch, capsys):
    """What an older transformers did before matrixrl refused it: every token after the first
    decoded without its context. With the guard taken away (as then), the rollout's log-probs
    are not the update's, and the gap alone fails the case (its mean passed the old limit, 0.5)."""
    from matrixrl.train import rollout

    decode = rollout.decode
    monkeypatch.setattr(rollout, "check_kv_cache_kept", lambda cache, expected: None)
    monkeypatch.setattr(rollout.prompt_cache, "prefilled_cache", lambda *args, **kwargs: None)
    monkeypatch.setattr(rollout, "decode", lambda model, *args, **kwargs: decode(Forgetful(model), *args, **kwargs))
    with pytest.raises(SystemExit) as exc:
        run_bench("gpu_smoke.py", "--device", "cpu", "--only", "single shared full")
    assert exc.value.code == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2] == "1 of 1 cases failed:"
    failure = re.fullmatch(
        r"  single shared full: log-prob gap of generator: mean (\d\.\d{3}) nats per token, not under 0\.05: "
        r"the rollout and the update compute different policies", lines[-1]
    )  # fmt: skip
    assert failure, lines[-1]
    assert 0.05 <= float(failure[1]) < 0.5  # what the old limit let through
