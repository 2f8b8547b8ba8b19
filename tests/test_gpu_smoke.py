"""bench/gpu_smoke.py, the GPU smoke test, runs on CPU with its tiny chat model: every
workflow × policy × adapter trains two steps and is evaluated, and what needs CUDA says it
was skipped. The paper's shapes run scaled down (the same code), their estimates and time on
paper print without building anything (``--dry``), and ``--budget-s`` skips what would not
fit. docs/performance.md, "GPU smoke test"."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO
from matrixrl.workflows import WORKFLOWS

QWEN3 = json.loads((REPO / "tests" / "fixtures" / "qwen3_configs.json").read_text())
SHAPES = ("qwen3-0.6b", "qwen3-1.7b", "qwen3-4b")
SMALL = (
    "--set", "train.max_new_tokens=8", "--set", "eval.max_new_tokens=8", "--set", "train.problems_per_step=2",
    "--set", "train.group_size=2", "--set", "eval.batch_size=4", "--set", "tasks.humaneval.n_eval=2",
    "--set", "tasks.gsm8k.n_eval=2", "--set", "train.micro_batch_tokens=1024", "--set", "train.threads=1",
    "--set", "eval.threads=1",
)  # fmt: skip
"""examples/paper.yaml's steps made small enough for a CPU (the shapes' code is the same), on one thread."""


def smoke_module():
    """bench/gpu_smoke.py's functions (its ``main`` not run)."""
    import runpy

    sys.path.insert(0, str(REPO / "bench"))
    try:
        return runpy.run_path(str(REPO / "bench" / "gpu_smoke.py"))
    finally:
        sys.path.remove(str(REPO / "bench"))


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


# --- the paper's shapes ---------------------------------------------------------------------------


def test_the_shapes_are_the_published_configs():
    shapes = smoke_module()["SHAPES"]
    assert list(shapes) == list(SHAPES)
    for name in SHAPES:
        assert {"model_type": "qwen3", **shapes[name]} == QWEN3[name], name


def test_the_stand_in_tokenizer_has_the_real_vocabulary_and_a_chat_template():
    from chat_models import stand_in_tokenizer

    tokenizer = stand_in_tokenizer(151_936)
    assert len(tokenizer) == 151_936
    text = "Abc09xyz"
    assert len(tokenizer(text, add_special_tokens=False).input_ids) == len(text)  # one token per character
    assert tokenizer.decode([151_935]) == "<|t151935|>"
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|user|>hi<|end|>\n<|assistant|>"


def test_the_op_counts_on_paper_are_the_models():
    """DECODE_OPS and UPDATE_OPS, what the time on paper launches, are what count_ops counts."""
    smoke = smoke_module()
    for adapter in ("full", "lora"):
        counted = smoke["count_ops"](adapter)
        assert counted == {"decode": smoke["DECODE_OPS"][adapter], "update": smoke["UPDATE_OPS"][adapter]}, adapter


def _plan_largest(tmp_path, scale_down: int = 1) -> dict:
    """Per shape, the largest training and evaluation job as `matrixrl plan` finds them
    (gpu_memory.fits.largest_jobs) with the shape's config.json in a folder: scale → job → Estimate."""
    from matrixrl.config import load_config
    from matrixrl.gpu_memory.fits import largest_jobs

    smoke = smoke_module()
    sets = []
    for name in SHAPES:
        folder = tmp_path / name
        folder.mkdir(parents=True)
        fields = QWEN3[name] if scale_down == 1 else smoke["shape_fields"](name, scale_down)
        (folder / "config.json").write_text(json.dumps(fields))
        sets.append(f"scales.{name}.path={folder}")
    largest, unknown = largest_jobs(load_config(REPO / "examples" / "paper.yaml", sets=sets))
    assert not unknown
    return largest


def test_dry_mode_prints_each_shapes_estimates_without_building_anything(tmp_path):
    """--dry for the three real shapes: every figure is the estimator's, for the job `plan` names,
    in a second or two and without importing torch."""
    from matrixrl.gpu_memory import gib

    out = tmp_path / "dry.json"
    code = (
        "import runpy, sys; sys.path.insert(0, 'bench');"
        f"sys.argv = ['gpu_smoke.py', '--shape', 'all', '--dry', '--json', {str(out)!r}];"
        "runpy.run_path('bench/gpu_smoke.py', run_name='__main__');"
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("examples/paper.yaml on paper for one H200 (989 TFLOP/s, 4.8 TB/s, host 29 µs per op)")
    largest = _plan_largest(tmp_path)
    parameters = {"qwen3-0.6b": "596,049,920", "qwen3-1.7b": "1,720,574,976", "qwen3-4b": "4,022,468,096"}
    written = json.loads(out.read_text())
    for name in SHAPES:
        at = lines.index(next(line for line in lines if line.startswith(f"{name}: ")))
        assert lines[at].startswith(f"{name}: {parameters[name]} parameters: hidden {QWEN3[name]['hidden_size']}, ")
        for k, job in enumerate(("training", "evaluation")):
            found = largest[name][job]
            dominant = max(found.parts, key=found.parts.__getitem__)
            assert lines[at + 1 + k] == (
                f"  {job}: {found.cell}: {gib(found.total)} GiB (tensors {gib(found.tensors)} GiB), mostly {dominant} "
                f"({gib(found.parts[dominant])} GiB), at {found.at}"
            )
            estimate = written["shapes"][name]["estimates"][job]
            assert (estimate["cell"], estimate["total_bytes"], estimate["tensors_bytes"]) == (found.cell, found.total, found.tensors)
        paper = written["shapes"][name]["paper"]
        for k, part in enumerate(("model", "training step", "evaluation batch")):
            assert lines[at + 3 + k].startswith(f"  {part}: ") and lines[at + 3 + k].endswith(f": {paper[part]['seconds']:,.1f} s")
            assert paper[part]["seconds"] > 0
    total = sum(p["seconds"] for shape in written["shapes"].values() for p in shape["paper"].values())
    assert lines[-1].startswith(f"on paper in all: {total:,.0f} s (qwen3-0.6b ")
    # the largest jobs at the paper's settings: the worker call's KV cache and the synthesizer's
    assert "orch_workers-humaneval-qwen3-4b-isolated-s0: 65.0 GiB" in proc.stdout


def check_scaled_shape(written: dict, name: str, tmp_path) -> None:
    """A scaled-down shape's JSON row: the jobs `plan` names, run and checked on CPU."""
    shape = next(row for row in written["shapes"] if row["shape"] == f"{name}/16")
    assert not shape["failures"] and not shape["skipped"], shape["failures"]
    fields = shape["fields"]
    heads = (QWEN3[name]["num_attention_heads"], QWEN3[name]["num_key_value_heads"])
    assert (fields["num_attention_heads"], fields["num_key_value_heads"]) == heads  # the structure kept
    assert fields["hidden_size"] == QWEN3[name]["hidden_size"] // 16 and fields["vocab_size"] == 151_936 // 16
    largest = _plan_largest(tmp_path / name, scale_down=16)[name]
    for job in ("training", "evaluation"):  # the jobs `plan` names (CPU: float32)
        assert shape["estimates"][job]["cell"] == largest[job].cell
    train, evaluation = shape["measured"]["training step"], shape["measured"]["evaluation batch"]
    roles = set(WORKFLOWS[largest["training"].cell.split("-")[0]].roles)
    assert set(train["logp_gap"]) == roles
    assert all(0 <= gap["mean"] < 0.05 for gap in train["logp_gap"].values())
    sets = {set_name: entry for set_name, entry in train["parameters"].items() if set_name != "frozen"}
    assert all(entry["lora_B_changed"] == entry["lora_B"] > 0 for entry in sets.values())  # paper.yaml trains LoRA
    assert train["parameters"]["frozen"]["changed"] == 0 < train["parameters"]["frozen"]["tensors"]
    assert train["completion_tokens"] > 0 and train["rollout_tok_s"] > 0 and train["update_tok_s"] > 0
    assert train["memory_check"]["allocated_bytes"] is None and train["mfu"] == {"rollout": None, "update": None}
    assert evaluation["completion_tokens"] == 4 * 8  # eval.batch_size rows, every one to max_new_tokens
    assert evaluation["chunk"].startswith("the synthesizer call: 4 rows")


def test_the_documented_dry_runs_are_the_scripts(run_bench):
    """docs/performance.md, "GPU smoke test", prints the dry mode's output and its budget on paper."""
    docs = (REPO / "docs" / "performance.md").read_text()
    lines = run_bench("gpu_smoke.py", "--shape", "all", "--dry")
    assert "$ python bench/gpu_smoke.py --shape all --dry\n" + "\n".join(lines) + "\n```" in docs
    window = ("--budget-s", "430", "--set", "train.max_new_tokens=256", "--set", "eval.max_new_tokens=256")  # gpu_window.sh's
    lines = run_bench("gpu_smoke.py", "--dry", "--cases", "--shape", "qwen3-4b,qwen3-0.6b,qwen3-1.7b", *window)
    assert " ".join(window) + " | tail -4\n" + "\n".join(lines[-4:]) + "\n```" in docs


def test_dry_mode_shows_what_a_budget_would_skip(run_bench, tmp_path):
    """--dry --budget-s: the run's admissions on a clock that advances by each part's time on paper."""
    out = tmp_path / "dry.json"
    lines = run_bench("gpu_smoke.py", "--dry", "--cases", "--shape", "all", "--budget-s", "460", "--json", str(out))
    written = json.loads(out.read_text())
    budget = written["budget"]
    papers = {f"{name} {part}": paper["seconds"] for name, shape in written["shapes"].items() for part, paper in shape["paper"].items()}
    assert "the cases on paper: 16 × 3 s = 48 s" in lines
    assert budget["skipped"], "the whole check does not fit 460 s on paper at 29 µs per op"
    skipped = 0.0
    for part in budget["skipped"]:
        assert part["line"] in lines and part["expected_s"] > part["left_s"]
        shape = part["part"].split()[0]  # "qwen3-4b training step", or the whole "qwen3-4b (model, ...)"
        skipped += papers[part["part"]] if part["part"] in papers else sum(v for k, v in papers.items() if k.startswith(f"{shape} "))
    assert budget["run_s"] <= 460
    assert budget["run_s"] + skipped == pytest.approx(48 + sum(papers.values()))
    n = len(budget["skipped"])
    assert lines[-1] == f"on paper within --budget-s 460: {budget['run_s']:,.0f} s run, {n} part{'' if n == 1 else 's'} skipped"


def test_a_scaled_down_shape_trains_and_evaluates_on_cpu(run_bench, tmp_path):
    """--shape with the shape scaled down: built, loaded as an hf scale, its largest training step
    and evaluation batch run once, reported in the table and the JSON."""
    out = tmp_path / "smoke.json"
    lines = run_bench("gpu_smoke.py", "--shape", "qwen3-0.6b", "--scale-down", "16", *SMALL, "--json", str(out), "--profile-decode", "2")
    assert lines[-1] == "shapes: 1 passed, 0 failed, 0 skipped"
    assert "no CUDA here: skipped for every shape: the memory peaks (allocated and reserved) and MFU" in lines
    # --profile-decode: the evaluation batch's call decoded under each sampler, per step
    profile = json.loads(out.read_text())["shapes"][0]["profile"]
    assert profile["call"].startswith("the synthesizer call: 4 rows × ") and profile["steps"] == 2
    at = lines.index(f"  decoding profile ({profile['call']}, 2 and 4 steps):")
    for k, sampler in enumerate(("training sampler", "evaluation sampler")):
        found = profile[sampler]
        assert found["ops_per_step"] > 0 and len(found["top_self_cpu"]) == 8, found
        assert lines[at + 1 + k].startswith(f"    {sampler}: {found['step_ms']:.1f} ms a step, {found['ops_per_step']:,.0f} ops a step")
    header = next(i for i, line in enumerate(lines) if line.startswith("shape  "))
    row = lines[header + 1]
    assert row.startswith("qwen3-0.6b/16 ") and " ok " in row and "n/a (CPU)" in row and "base same" in row, row
    assert row.split(" ok  ")[1].startswith("orchestrator ")  # the log-prob gap per role, last
    check_scaled_shape(json.loads(out.read_text()), "qwen3-0.6b", tmp_path)


@pytest.mark.slow
def test_the_whole_check_scaled_down_within_its_budget(run_bench, tmp_path):
    """A case and the three shapes scaled down, under a budget they fit: nothing skipped, one table
    row each, one JSON file."""
    out = tmp_path / "smoke.json"
    lines = run_bench(
        "gpu_smoke.py", "--cases", "--only", "single shared full", "--shape", "all", "--scale-down", "16", *SMALL,
        "--budget-s", "900", "--json", str(out),
    )  # fmt: skip
    assert not [line for line in lines if line.startswith("skipped ")]
    assert "all 1 cases passed" in lines and lines[-1] == "shapes: 3 passed, 0 failed, 0 skipped"
    written = json.loads(out.read_text())
    assert [row["case"] for row in written["cases"]] == ["single shared full"] and written["skipped"] == []
    for name in SHAPES:
        check_scaled_shape(written, name, tmp_path)


def test_a_budget_too_small_skips_every_part_with_its_line(run_bench):
    lines = run_bench("gpu_smoke.py", "--cases", "--only", "single shared", "--shape", "all", "--scale-down", "16", *SMALL, "--budget-s", "0.5")
    skipped = [line for line in lines if line.startswith("skipped ")]
    pattern = r"skipped {}: expected ([\d.,]+) s \(on paper\), ([\d.]+) s of --budget-s 0.5 left"
    parts = ["case single shared full", "case single shared lora"]
    parts += [f"{name}/16 (model, training step, evaluation batch)" for name in SHAPES]
    assert len(skipped) == len(parts)
    for line, part in zip(skipped, parts):
        found = re.fullmatch(pattern.format(re.escape(part)), line)
        assert found, line
        assert float(found[1].replace(",", "")) > 0.5 >= float(found[2])
    assert "no case ran (2 skipped)" in lines
    assert lines[-1] == "shapes: 0 passed, 0 failed, 3 skipped; parts skipped: 5"


def test_the_budget_counts_with_what_was_measured_so_far():
    """Expected: the time on paper times measured over paper of the parts run so far (of the kind,
    else of every shape part; cases apart); a part expected past what is left is skipped."""
    budget_class = smoke_module()["Budget"]
    now = [0.0]
    budget = budget_class(10.0, clock=lambda: now[0])
    assert budget.admit("qwen3-0.6b training step", "training step", 4.0)
    now[0] = 8.0
    budget.record("training step", 4.0, 8.0)  # twice what the paper said
    assert budget.expected("case", 3.0) == (3.0, "on paper")
    assert budget.expected("evaluation batch", 0.5)[0] == 1.0  # no evaluation measured: every shape part's ratio
    assert budget.admit("qwen3-0.6b evaluation batch", "evaluation batch", 0.9)  # 1.8 s of 2 s left
    assert not budget.admit("qwen3-1.7b training step", "training step", 1.5)
    assert budget.skipped[-1]["line"] == (
        "skipped qwen3-1.7b training step: expected 3 s (1.5 s on paper × 2.00, measured over paper so far), "
        "2 s of --budget-s 10 left"
    )
    unlimited = budget_class(None)
    assert unlimited.admit("anything", "training step", 1e9) and unlimited.left() is None


def test_a_diverging_case_is_trained_again_under_each_gpu_only_variant(tmp_path):
    """On the H200, every eval_opt case's first step gave a NaN gradient (the loss finite). A case
    that diverges on CUDA is trained again with TRL's torch log-softmax, SDPA's math kernel,
    both, and float32: each variant context works (here, on CPU, every one trains)."""
    smoke = smoke_module()
    args = smoke["parse_args"](["--device", "cpu"])
    sys.path.insert(0, str(REPO / "bench"))
    try:
        model, _ = smoke["default_model"](tmp_path / "model", False)
        outcomes = smoke["divergence_variants"]("eval_opt shared lora", model, args, tmp_path / "variants")
    finally:
        sys.path.remove(str(REPO / "bench"))
    assert outcomes == {"torch log-softmax": "trains", "math attention": "trains", "both": "trains", "float32": "trains"}


def test_a_shape_part_that_raises_is_named_with_its_time_and_the_next_part_runs(run_bench, monkeypatch, capsys, tmp_path):
    """As on the H200, where each shape part met an out-of-memory error: the part fails with its
    error and how long it ran, the JSON keeps both, the evaluation batch still runs, exit 1."""
    import matrixrl.train.update as update

    def out_of_memory(*args, **kwargs):
        raise MemoryError("CUDA out of memory (made up by the test)")

    monkeypatch.setattr(update, "update_policy", out_of_memory)
    out = tmp_path / "smoke.json"
    with pytest.raises(SystemExit) as exc:
        run_bench("gpu_smoke.py", "--shape", "qwen3-0.6b", "--scale-down", "16", *SMALL, "--json", str(out))
    assert exc.value.code == 1
    lines = capsys.readouterr().out.splitlines()
    assert "  training step: FAILED (training step: MemoryError: CUDA out of memory (made up by the test))" in lines
    failed = next(line for line in lines if line.startswith("  training step: failed after "))
    assert re.fullmatch(r"  training step: failed after \d+\.\d s \(\d+\.\d s on paper\)", failed), failed
    assert any(line.startswith("  evaluation batch (the synthesizer call") for line in lines)
    (row,) = json.loads(out.read_text())["shapes"]
    assert list(row["failed_after_s"]) == ["training step"] and "evaluation batch" in row["measured"]
    assert lines[-2:] == ["shapes: 0 passed, 1 failed, 0 skipped", "  qwen3-0.6b/16: training step: MemoryError: CUDA out of memory (made up by the test)"]


def test_a_capped_part_sets_the_allocators_cap_restores_it_and_keeps_its_peaks_when_it_raises(monkeypatch):
    """DeviceMemory.peak on CUDA (torch.cuda's calls stood in for: no GPU here): the caching
    allocator is capped at the baseline's reserved bytes plus the estimate's total less the CUDA
    context, the cap is lifted after the block, and a block that runs out of memory still
    leaves the peaks it reached (as the H200's parts did)."""
    import torch

    from matrixrl.gpu_memory.peak import CUDA_CONTEXT, GIB

    smoke = smoke_module()
    fractions = []
    fake = {
        "synchronize": lambda: None, "reset_peak_memory_stats": lambda: None, "current_device": lambda: 0,
        "get_device_properties": lambda device: type("Properties", (), {"total_memory": 140 * GIB})(),
        "set_per_process_memory_fraction": lambda fraction: fractions.append(fraction),
        "max_memory_allocated": lambda: 50 * GIB, "max_memory_reserved": lambda: 57 * GIB,
    }  # fmt: skip
    for name, stand_in in fake.items():
        monkeypatch.setattr(torch.cuda, name, stand_in)
    memory = smoke["DeviceMemory"](True)
    memory.base = (1 * GIB, 2 * GIB)
    estimate = type("Estimate", (), {"total": 65 * GIB})()
    found: dict = {}
    with pytest.raises(torch.OutOfMemoryError):
        with memory.peak(found, "memory", estimate):
            raise torch.OutOfMemoryError("CUDA out of memory (made up by the test)")
    assert fractions == [(2 * GIB + 65 * GIB - CUDA_CONTEXT) / (140 * GIB), 1.0]
    assert memory.last == (49 * GIB, 55 * GIB) and "memory" not in found
    with memory.peak(found, "memory", estimate):
        pass
    assert found["memory"] == (49 * GIB, 55 * GIB) and fractions[-1] == 1.0
