"""What a workflow asks of the model: its ``generate`` calls and agents' turns, in rows and tokens.

The worst case a job can meet; its assumptions: docs/real-models.md, "The parts of an estimate".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

CHARS_PER_TOKEN = 3
"""Characters per token of a quoted reply (math text: 2.9 with SmolLM2's tokenizer); fewer means longer prompts."""

CHAT_ROLE_TOKENS = {
    "generator": 45,
    "refine": 80,
    "evaluator": 90,
    "aggregator": 65,
    "orchestrator": 70,
    "worker": 60,
    "synthesizer": 70,
}
"""Tokens of a chat prompt without its question and quotes: the role's system message, the
user message's labels and the chat template. Counted with SmolLM2's tokenizer (generator 37,
refine 70, evaluator 80, aggregator of 3 replies 72, orchestrator 61, worker 50, synthesizer
of 3 replies 76), plus Qwen3's empty think block (4) and a margin."""

CHAT_TEMPLATE_TOKENS = 24
"""Tokens of a chat template around a system and a user message and the assistant's opening
(Qwen3: 3 markers and a role per message, newlines, an empty think block), with a margin."""

CANDIDATE_LABEL_TOKENS = 5  # "\n\nSolution i:\n" before each quoted reply
ELLIPSIS_TOKENS = 3  # "[...] " before a quote that was cut

QUESTION_TOKENS = {"gsm8k": 200, "math": 400, "math_generic": 400, "humaneval": 450, "code_generic": 450}
"""Tokens of the longest question in a batch, per task kind (GSM8K's longest are about 200
tokens, MATH's and HumanEval's several hundred); arith and pyfunc are computed from their settings."""

CODE_KINDS = ("pyfunc", "humaneval", "code_generic")  # the rest are math tasks (eval_opt's default rounds)


@dataclass(frozen=True)
class Call:
    """One ``generate`` call: the rows one chunk of it decodes, its distinct prompts, the longest prompt."""

    kind: str  # the prompt's kind: a role, or "refine"
    rows: int
    distinct: int
    prompt: int


@dataclass(frozen=True)
class Agent:
    """One agent's turns in a step's update: how many, the longest prompt and the reply."""

    role: str
    agent: str
    turns: int
    prompt: int


def question_tokens(task) -> int:
    """Tokens (characters for arith and pyfunc) of the longest question of a batch."""
    if task.kind == "arith":
        return task.terms * task.digits + task.terms - 1
    if task.kind == "pyfunc":
        return task.examples * 7 - 1  # "9>90," per example
    return QUESTION_TOKENS.get(task.kind, 400)


def prompt_tokens(spec, kind: str, reply: int, n: int, question: int | None = None) -> int:
    """Tokens of the longest prompt of ``kind`` (a role, or "refine") when replies are
    ``reply`` tokens and ``n`` agents are quoted (voting's aggregator, the synthesizer)."""
    q = question_tokens(spec.task) if question is None else question
    if spec.scale.prompt_style == "compact":  # matrixrl.workflows.styles.compact: characters
        answer, feedback = 8, 3
        return q + {
            "generator": 1, "orchestrator": 1, "worker": 3, "evaluator": answer + 2, "refine": answer + feedback + 2,
            "aggregator": n * (answer + 1) + 1, "synthesizer": n * (answer + 1) + 1,
        }[kind]  # fmt: skip
    prompts = spec.prompts
    quote = min(reply, math.ceil(prompts.quote_chars / CHARS_PER_TOKEN) + ELLIPSIS_TOKENS)
    extra = {
        "generator": 0, "orchestrator": 0, "evaluator": quote, "refine": 2 * quote,
        "worker": min(reply, math.ceil(prompts.strategy_chars / CHARS_PER_TOKEN)),
        "aggregator": n * (quote + CANDIDATE_LABEL_TOKENS), "synthesizer": n * (quote + CANDIDATE_LABEL_TOKENS),
    }[kind]  # fmt: skip
    return CHAT_ROLE_TOKENS[kind] + q + extra


def eval_opt_rounds(spec) -> int:
    rounds = spec.workflow.get("max_iterations")
    return rounds or (2 if spec.task.kind in CODE_KINDS else 3)


def workflow_plan(spec, episodes: int, problems: int, reply: int, prompt=None) -> tuple[list[Call], list[Agent]]:
    """The ``generate`` calls and agents of a batch of ``episodes`` rollouts of ``problems`` problems,
    ``reply`` tokens each."""
    workflow = spec.cell.workflow
    n = spec.workflow.get("n_votes") or spec.workflow.get("n_workers") or 3

    def p(kind: str) -> int:
        if prompt is not None and kind in prompt:
            return prompt[kind]
        return prompt_tokens(spec, kind, reply, n)

    b, d = episodes, min(problems, episodes)
    if workflow == "single":
        return [Call("generator", b, d, p("generator"))], [Agent("generator", "generator0", b, p("generator"))]
    if workflow == "voting":
        calls = [Call("generator", n * b, d, p("generator")), Call("aggregator", b, b, p("aggregator"))]
        agents = [Agent("generator", f"generator{a}", b, p("generator")) for a in range(n)]
        return calls, [*agents, Agent("aggregator", "aggregator0", b, p("aggregator"))]
    if workflow == "orch_workers":
        calls = [
            Call("orchestrator", b, d, p("orchestrator")), Call("worker", n * b, n * b, p("worker")),
            Call("synthesizer", b, b, p("synthesizer")),
        ]  # fmt: skip
        agents = [Agent("worker", f"worker{a}", b, p("worker")) for a in range(n)]
        return calls, [
            Agent("orchestrator", "orchestrator0", b, p("orchestrator")), *agents,
            Agent("synthesizer", "synthesizer0", b, p("synthesizer")),
        ]  # fmt: skip
    if workflow == "eval_opt":
        rounds = eval_opt_rounds(spec)
        calls = [Call("generator", b, d, p("generator"))]
        if rounds > 1:
            calls += [Call("evaluator", b, b, p("evaluator")), Call("refine", b, b, p("refine"))]
        longest = max(p("generator"), p("refine")) if rounds > 1 else p("generator")
        agents = [Agent("generator", "generator0", rounds * b, longest)]
        if rounds > 1:
            agents.append(Agent("evaluator", "evaluator0", (rounds - 1) * b, p("evaluator")))
        return calls, agents
    raise ValueError(f"no memory plan for workflow {workflow!r}")


def chunks(call: Call, cap: int | None) -> Call:
    """The largest chunk of ``call`` that one ``decode`` runs (at most ``cap`` rows)."""
    rows = min(call.rows, cap) if cap else call.rows
    return replace(call, rows=rows, distinct=max(1, min(call.distinct, rows)))


# --- memory jobs (matrixrl.jobs.memory) -----------------------------------------------------------


def task_family(task) -> str:
    return "code" if task.kind in CODE_KINDS else "math"


def _text_tokens(*texts: str) -> int:
    return math.ceil(sum(len(t) for t in texts) / CHARS_PER_TOKEN)


def label_prompt_tokens(task) -> int:
    """Tokens of the labeller's longest prompt: its messages (the options of the task's
    family), the chat template and the question."""
    from matrixrl.memcollab.labels import labeller_messages

    return CHAT_TEMPLATE_TOKENS + _text_tokens(*labeller_messages("", task_family(task))) + question_tokens(task)


def distill_prompt_tokens(spec) -> int:
    """Tokens of the distiller's longest prompt: its messages for a contrast pair, two
    trajectories quoted at ``prompts.quote_chars``, the question, the template and the prefix."""
    from matrixrl.memcollab.data import Pair, Trajectory
    from matrixrl.memcollab.distill import distiller_messages

    right, wrong = (Trajectory("p", "", "m", "", "", correct, 0) for correct in (True, False))
    family = task_family(spec.task)
    messages = distiller_messages(Pair("p", "", right, wrong), family, spec.entries_per_problem, spec.prompts.quote_chars)
    quote = math.ceil(spec.prompts.quote_chars / CHARS_PER_TOKEN) + ELLIPSIS_TOKENS
    return CHAT_TEMPLATE_TOKENS + _text_tokens(*messages, spec.prefix) + question_tokens(spec.task) + 2 * quote


def memory_calls(spec, job: str) -> tuple[list[Call], int, str]:
    """A memory job's ``generate`` calls (chunks of ``spec.batch_size`` rows), reply tokens and chooser.

    docs/real-models.md, "The parts of an estimate".
    """
    batch = spec.batch_size
    if job == "collect":
        prompt = CHAT_ROLE_TOKENS["generator"] + question_tokens(spec.task)
        chunk = chunks(Call("generator", spec.problems * spec.samples, spec.problems, prompt), batch)
        chunk = replace(chunk, distinct=max(1, math.ceil(chunk.rows / spec.samples)))
        return [chunk], spec.max_new_tokens, "keyed" if spec.temperature > 0 else "greedy"
    if job == "label":
        rows = spec.problems + (getattr(spec.task, "n_eval", None) or 0)
        call = Call("labeller", rows, rows, label_prompt_tokens(spec.task))
        return [chunks(call, batch)], spec.max_new_tokens, "greedy"
    if job == "distill":
        call = Call("distiller", spec.problems, spec.problems, distill_prompt_tokens(spec))
        return [chunks(call, batch)], spec.max_new_tokens, "greedy"
    raise ValueError(f"memory jobs are collect, label and distill, not {job!r}")
