"""Workflows driven by a fake ``generate``: episode shapes, batching, prompts, warm-start data."""

from __future__ import annotations

import re

import numpy as np
import pytest
from pydantic import ValidationError

from matrixrl.tasks.base import Problem
from matrixrl.workflows.styles import compact as P
from matrixrl.workflows.base import Completion
from matrixrl.workflows.eval_opt import EvalOpt
from matrixrl.workflows.eval_opt import Settings as EvalOptSettings
from matrixrl.workflows.orch_workers import OrchWorkers
from matrixrl.workflows.orch_workers import Settings as OrchSettings
from matrixrl.workflows.voting import Settings as VotingSettings
from matrixrl.workflows.voting import Voting


def problem(question: str) -> Problem:
    return Problem(id=question, question=question, answer=str(sum(int(x) for x in question.split("+"))))


PROBLEMS = [problem(q) for q in ("4+8+9", "1+2+3", "7+7+0", "5+5+5")]
GROUPS = [0, 0, 1, 1]


class FakeGenerate:
    """Records every call; answers with ``reply(role, prompt, k)`` (k counts that role's calls)."""

    def __init__(self, reply=None):
        self.calls: list[tuple[str, list[str]]] = []
        self.reply = reply or (lambda role, prompt, k: f"{role[0]}{k}")

    def __call__(self, role: str, prompts: list[str]) -> list[Completion]:
        k = sum(1 for r, _ in self.calls if r == role)
        self.calls.append((role, list(prompts)))
        out = []
        for prompt in prompts:
            text = self.reply(role, prompt, k)
            out.append(Completion(text, [ord(c) for c in prompt], [ord(c) for c in text]))
        return out

    def shape(self) -> list[tuple[str, int]]:
        return [(role, len(prompts)) for role, prompts in self.calls]


def turn_keys(episode) -> list[tuple[str, str, int]]:
    return [(t.role, t.agent, t.index) for t in episode.turns]


# --- settings ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cls, settings, key, default, low",
    [
        (Voting, VotingSettings, "n_votes", 3, 1),
        (OrchWorkers, OrchSettings, "n_workers", 3, 1),
    ],
)
def test_settings_defaults_validation_and_coercion(cls, settings, key, default, low):
    assert getattr(cls().settings, key) == default
    assert getattr(cls(None).settings, key) == default
    assert getattr(cls({key: default + 2}).settings, key) == default + 2
    given = settings(**{key: default + 1})
    assert cls(given).settings is given
    with pytest.raises(ValidationError):
        settings(**{key: low})
    with pytest.raises(ValidationError):
        settings(bogus=1)
    with pytest.raises(ValidationError):
        given.__setattr__(key, 9)  # frozen


def test_eval_opt_iterations_default_by_task_family_and_validation():
    assert EvalOpt().settings.max_iterations is None
    assert EvalOpt().max_iterations == 3  # the compact style defaults to a math task
    assert EvalOpt(style=P.CompactStyle("math")).max_iterations == 3
    assert EvalOpt(style=P.CompactStyle("code")).max_iterations == 2
    assert EvalOpt({"max_iterations": 5}, P.CompactStyle("code")).max_iterations == 5
    given = EvalOptSettings(max_iterations=4)
    assert EvalOpt(given).settings is given
    with pytest.raises(ValidationError):
        EvalOptSettings(max_iterations=0)
    with pytest.raises(ValidationError):
        EvalOptSettings(bogus=1)
    with pytest.raises(ValidationError):
        given.__setattr__("max_iterations", 9)  # frozen


# --- voting ----------------------------------------------------------------------------


def test_voting_shape_batching_and_answer():
    gen = FakeGenerate(lambda role, prompt, k: {"generator": "G", "aggregator": "A"}[role] + prompt[:1])
    episodes = Voting().run(PROBLEMS, GROUPS, gen)
    B = len(PROBLEMS)
    assert gen.shape() == [("generator", 3 * B), ("aggregator", B)]
    assert gen.calls[0][1] == [P.generator_compact(p) for p in PROBLEMS] * 3
    for episode, p, g in zip(episodes, PROBLEMS, GROUPS):
        assert episode.problem == p and episode.group == g
        assert turn_keys(episode) == [
            ("generator", "generator0", 0),
            ("generator", "generator1", 0),
            ("generator", "generator2", 0),
            ("aggregator", "aggregator0", 0),
        ]
        assert all(t.prompt == P.generator_compact(p) for t in episode.turns[:3])
        assert episode.turns[3].prompt == P.aggregator_compact(p, ["G" + p.question[0]] * 3)
        assert episode.answer == episode.turns[3].completion.text == "A" + p.question[0]


def test_voting_aggregator_sees_each_agents_answer_in_order():
    counter = iter(range(100))
    gen = FakeGenerate(lambda role, prompt, k: str(next(counter)) if role == "generator" else "x")
    episodes = Voting({"n_votes": 4}).run(PROBLEMS, GROUPS, gen)
    B = len(PROBLEMS)
    assert gen.shape() == [("generator", 4 * B), ("aggregator", B)]
    for i, episode in enumerate(episodes):
        answers = [str(a * B + i) for a in range(4)]
        assert [t.completion.text for t in episode.turns[:4]] == answers
        assert episode.turns[4].prompt == f"{episode.problem.question}?{','.join(answers)}="
        assert [t.agent for t in episode.turns] == [f"generator{a}" for a in range(4)] + ["aggregator0"]


# --- eval_opt -------------------------------------------------------------------------


def test_eval_opt_never_satisfied_runs_max_iterations():
    gen = FakeGenerate(lambda role, prompt, k: "N+" if role == "evaluator" else f"{k}")
    episodes = EvalOpt().run(PROBLEMS, GROUPS, gen)
    B = len(PROBLEMS)
    assert gen.shape() == [("generator", B), ("evaluator", B), ("generator", B), ("evaluator", B), ("generator", B)]
    for episode, p, g in zip(episodes, PROBLEMS, GROUPS):
        assert episode.group == g
        assert turn_keys(episode) == [
            ("generator", "generator0", 0),
            ("evaluator", "evaluator0", 0),
            ("generator", "generator0", 1),
            ("evaluator", "evaluator0", 1),
            ("generator", "generator0", 2),
        ]
        prompts = [t.prompt for t in episode.turns]
        assert prompts == [
            P.generator_compact(p),
            P.evaluator_compact(p, "0"),
            P.refine_compact(p, "0", "N+"),
            P.evaluator_compact(p, "1"),
            P.refine_compact(p, "1", "N+"),
        ]
        assert prompts[2] == f"{p.question}=0N+="
        assert episode.answer == "2"


def test_eval_opt_stops_early_per_episode():
    satisfied_first = {PROBLEMS[0].question, PROBLEMS[2].question}  # Y after the first draft

    def reply(role, prompt, k):
        if role == "generator":
            return f"d{k}"
        question = prompt.split("=")[0]
        if question in satisfied_first:
            return "Y"
        return "Y" if k == 1 and question == PROBLEMS[1].question else "N-"

    gen = FakeGenerate(reply)
    episodes = EvalOpt({"max_iterations": 4}).run(PROBLEMS, GROUPS, gen)
    # Everyone drafts; 2 are done after the first verdict; problem 1 after the second.
    assert gen.shape() == [
        ("generator", 4),
        ("evaluator", 4),
        ("generator", 2),
        ("evaluator", 2),
        ("generator", 1),
        ("evaluator", 1),
        ("generator", 1),
    ]
    assert [len(e.turns) for e in episodes] == [2, 4, 2, 7]
    assert [e.answer for e in episodes] == ["d0", "d1", "d0", "d3"]
    assert turn_keys(episodes[1])[-1] == ("evaluator", "evaluator0", 1)
    assert turn_keys(episodes[3]) == [
        (role, f"{role}0", i) for i in range(4) for role in ("generator", "evaluator")
    ][:-1]
    assert gen.calls[2][1] == [P.refine_compact(p, "d0", "N-") for p in (PROBLEMS[1], PROBLEMS[3])]


def test_eval_opt_single_iteration_and_all_satisfied():
    gen = FakeGenerate(lambda role, prompt, k: "Y")
    episodes = EvalOpt({"max_iterations": 1}).run(PROBLEMS, GROUPS, gen)
    assert gen.shape() == [("generator", 4)]
    assert all(turn_keys(e) == [("generator", "generator0", 0)] for e in episodes)

    gen = FakeGenerate(lambda role, prompt, k: "Y")
    episodes = EvalOpt().run(PROBLEMS, GROUPS, gen)
    assert gen.shape() == [("generator", 4), ("evaluator", 4)]
    assert all(len(e.turns) == 2 and e.answer == "Y" for e in episodes)


def test_parse_verdict():
    assert P.parse_verdict("Y") == (True, "Y")
    assert P.parse_verdict(" Y\n") == (True, "Y")
    assert P.parse_verdict("N+") == (False, "N+")
    assert P.parse_verdict("") == (False, "")
    assert P.parse_verdict("yes") == (False, "yes")
    assert P.parse_verdict("N+,\nxyz")[1] == "N+_"


# --- orch_workers ---------------------------------------------------------------------


def test_orch_workers_shape_strategies_and_answer():
    plans = {"4+8+9:": "LRP", "1+2+3:": "C", "7+7+0:": "", "5+5+5:": "P,R,L,C"}

    def reply(role, prompt, k):
        if role == "orchestrator":
            return plans[prompt]
        if role == "worker":
            return prompt[0] + "w"
        return "S" + prompt.split("?")[1]

    gen = FakeGenerate(reply)
    episodes = OrchWorkers().run(PROBLEMS, GROUPS, gen)
    B = len(PROBLEMS)
    assert gen.shape() == [("orchestrator", B), ("worker", 3 * B), ("synthesizer", B)]
    expected = [["L", "R", "P"], ["C", "C", "C"], ["L", "L", "L"], ["P", "R", "L"]]
    for i, (episode, p, g) in enumerate(zip(episodes, PROBLEMS, GROUPS)):
        assert episode.group == g and episode.problem == p
        assert turn_keys(episode) == [
            ("orchestrator", "orchestrator0", 0),
            ("worker", "worker0", 0),
            ("worker", "worker1", 0),
            ("worker", "worker2", 0),
            ("synthesizer", "synthesizer0", 0),
        ]
        assert episode.turns[0].prompt == P.orchestrator_compact(p)
        worker_prompts = [t.prompt for t in episode.turns[1:4]]
        assert worker_prompts == [P.worker_compact(p, s) for s in expected[i]]
        assert [gen.calls[1][1][a * B + i] for a in range(3)] == worker_prompts
        answers = [s + "w" for s in expected[i]]
        assert episode.turns[4].prompt == P.synthesizer_compact(p, answers)
        assert episode.answer == episode.turns[4].completion.text == "S" + ",".join(answers) + "="


def test_orch_workers_more_workers_than_strategy_tokens():
    gen = FakeGenerate(lambda role, prompt, k: "LR" if role == "orchestrator" else "1")
    episodes = OrchWorkers({"n_workers": 5}).run(PROBLEMS[:2], [7, 8], gen)
    assert gen.shape() == [("orchestrator", 2), ("worker", 10), ("synthesizer", 2)]
    assert [e.group for e in episodes] == [7, 8]
    assert [t.prompt[0] for t in episodes[0].turns[1:6]] == ["L", "R", "R", "R", "R"]


def test_parse_strategies():
    assert P.parse_strategies("LRP", 3) == ["L", "R", "P"]
    assert P.parse_strategies("L,R,P,C", 2) == ["L", "R"]
    assert P.parse_strategies("xRz", 3) == ["R", "R", "R"]
    assert P.parse_strategies("", 2) == [P.DEFAULT_STRATEGY] * 2


# --- warm-start data ------------------------------------------------------------------

WARM = [problem(f"{a}+{b}+{c}") for a, b, c in np.random.default_rng(0).integers(0, 10, size=(60, 3))]

FORMATS = {
    "generator": re.compile(r"^\d+(\+\d+)*=$"),
    "refine": re.compile(r"^\d+(\+\d+)*=\d+N[+-]?=$"),
    "evaluator": re.compile(r"^\d+(\+\d+)*=\d+\?$"),
    "candidates": re.compile(r"^\d+(\+\d+)*\?\d+(,\d+)+=$"),
    "orchestrator": re.compile(r"^\d+(\+\d+)*:$"),
    "worker": re.compile(r"^[A-Z]\|\d+(\+\d+)*=$"),
}


def kind(prompt: str) -> str:
    matches = [name for name, pattern in FORMATS.items() if pattern.match(prompt)]
    assert len(matches) == 1, (prompt, matches)
    return matches[0]


def answer_of(prompt: str) -> str:
    question = re.match(r"^(?:[A-Z]\|)?(\d+(?:\+\d+)*)", prompt).group(1)
    return str(sum(int(x) for x in question.split("+")))


def test_voting_warmstart_pairs():
    pairs = Voting().warmstart_pairs(WARM, np.random.default_rng(1))
    kinds = [kind(p) for p, _ in pairs]
    assert set(kinds) == {"generator", "candidates"}
    present = absent = 0
    for prompt, target in pairs:
        right = answer_of(prompt)
        if kind(prompt) == "generator":
            assert target == right
            continue
        candidates = prompt[:-1].split("?")[1].split(",")
        assert len(candidates) == 3
        assert all(c == right or 1 <= abs(int(c) - int(right)) <= 10 for c in candidates)
        assert all(int(c) >= 0 for c in candidates)
        if right in candidates:
            present += 1
            assert target == right
        else:
            absent += 1
            assert target == P.majority(candidates) and target != right
    assert present > 0 and absent > 0
    mixed = [p for p, _ in pairs if kind(p) == "candidates" and len(set(p[:-1].split("?")[1].split(","))) > 1]
    assert mixed  # right and wrong candidates side by side


def test_eval_opt_warmstart_pairs():
    pairs = EvalOpt().warmstart_pairs(WARM, np.random.default_rng(2))
    by_kind: dict[str, list] = {}
    for prompt, target in pairs:
        by_kind.setdefault(kind(prompt), []).append((prompt, target))
    assert set(by_kind) == {"generator", "evaluator", "refine"}
    verdicts = [t for _, t in by_kind["evaluator"]]
    assert verdicts.count("Y") == len(verdicts) // 2  # balanced right/wrong drafts
    for prompt, target in by_kind["evaluator"]:
        draft, right = prompt[:-1].split("=")[1], answer_of(prompt)
        assert target == ("Y" if draft == right else "N+" if int(right) > int(draft) else "N-")
    assert {"N+", "N-"} <= set(verdicts)
    for prompt, target in by_kind["refine"]:
        draft = re.match(r"^[\d+]+=(\d+)N", prompt).group(1)
        assert target == answer_of(prompt) != draft
        assert prompt == P.refine_compact(problem(prompt.split("=")[0]), draft, P.verdict_for(draft, target))
    assert all(t == answer_of(p) for p, t in by_kind["generator"])


def test_orch_workers_warmstart_pairs():
    pairs = OrchWorkers().warmstart_pairs(WARM, np.random.default_rng(3))
    by_kind: dict[str, list] = {}
    for prompt, target in pairs:
        by_kind.setdefault(kind(prompt), []).append((prompt, target))
    assert set(by_kind) == {"orchestrator", "worker", "candidates"}
    plans = [t for _, t in by_kind["orchestrator"]]
    assert all(len(t) == 3 and set(t) <= set(P.STRATEGIES) and len(set(t)) == 3 for t in plans)
    assert len(set(plans)) > 5  # random, not one fixed plan
    for prompt, target in by_kind["worker"]:
        assert prompt[0] in P.STRATEGIES and target == answer_of(prompt)
    outcomes = set()
    for prompt, target in by_kind["candidates"]:
        right, candidates = answer_of(prompt), prompt[:-1].split("?")[1].split(",")
        outcomes.add(right in candidates)
        assert target == (right if right in candidates else P.majority(candidates))
    assert outcomes == {True, False}


@pytest.mark.parametrize("cls", [Voting, EvalOpt, OrchWorkers])
def test_warmstart_pairs_single_problem_and_seeded(cls):
    # prepare_base asks for one problem at a time; fixed seeds give fixed data.
    one = [problem("3+4+5")]
    a = cls().warmstart_pairs(one, np.random.default_rng(5))
    b = cls().warmstart_pairs(one, np.random.default_rng(5))
    assert a == b and len(a) == {Voting: 2, EvalOpt: 4, OrchWorkers: 3}[cls]
    assert all(prompt and target and "\n" not in prompt for prompt, target in a)
    assert all(len(prompt) + len(target) + 1 <= 32 for prompt, target in a)


def test_wrong_answer_is_task_agnostic():
    rng = np.random.default_rng(0)
    for _ in range(200):
        w = P.wrong_answer("3", rng)
        assert w != "3" and 0 <= int(w) <= 13
    assert P.wrong_answer("-5", rng) != "-5"
    assert P.wrong_answer("x", rng, ["x", "y"]) == "y"
    assert P.wrong_answer("x", rng, ["x"]) not in ("x", "")
    assert P.wrong_answer("", rng) != ""


def test_prompt_helpers():
    assert P.majority(["1", "2", "2", "1"]) == "1"
    assert P.majority(["5", "7", "7"]) == "7"
    assert P.pick_target(["5", "7", "7"], "5") == "5"
    assert P.pick_target(["5", "7", "7"], "6") == "7"
    assert P.aggregator_compact(PROBLEMS[0], ["2,1", " 21\n", "x" * 20]) == "4+8+9?2_1,21,xxxxxxxx="
    assert P.verdict_for("20", "21") == "N+"
    assert P.verdict_for("22", "21") == "N-"
    assert P.verdict_for(" 21", "21") == "Y"
    assert P.verdict_for("abc", "21") == "N"
    assert P.format_strategies(["L", "R", "P"]) == "LRP"
    for name in ("refine_compact", "evaluator_compact", "aggregator_compact", "orchestrator_compact",
                 "worker_compact", "synthesizer_compact", "verdict_for", "parse_verdict", "parse_strategies"):
        assert getattr(P, name).__doc__


# --- lockstep: plays run round by round ------------------------------------------------


def test_lockstep_makes_one_call_per_role_and_round_with_rows_in_play_order():
    from matrixrl.workflows.base import Episode, Turn, lockstep

    def play(problem, group, roles):
        """Asks ``roles`` in turn, each prompt naming the play; a play with no roles asks nothing."""
        episode = Episode(problem=problem, group=group)
        for role in roles:
            prompt = f"{problem.question}:{role}"
            completion = yield role, prompt
            episode.turns.append(Turn(role, f"{role}0", 0, prompt, completion))
        return episode

    scripts = [("a", "b"), ("b", "a", "a"), (), ("a",)]
    gen = FakeGenerate(lambda role, prompt, k: f"{prompt}/{k}")
    episodes = lockstep([play(p, g, r) for p, g, r in zip(PROBLEMS, GROUPS, scripts)], gen)
    q = [p.question for p in PROBLEMS]
    # Round 1 asks a of plays 0 and 3, b of play 1, in the order roles first appear; round 2 ...
    assert gen.calls == [
        ("a", [f"{q[0]}:a", f"{q[3]}:a"]),
        ("b", [f"{q[1]}:b"]),
        ("b", [f"{q[0]}:b"]),
        ("a", [f"{q[1]}:a"]),
        ("a", [f"{q[1]}:a"]),
    ]
    assert [[t.completion.text for t in e.turns] for e in episodes] == [
        [f"{q[0]}:a/0", f"{q[0]}:b/1"],
        [f"{q[1]}:b/0", f"{q[1]}:a/1", f"{q[1]}:a/2"],
        [],
        [f"{q[3]}:a/0"],
    ]
    assert [e.group for e in episodes] == GROUPS
