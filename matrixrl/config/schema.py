"""The experiments.yaml schema: one pydantic model per section.

Every model forbids unknown keys and every field has a description (docs/config-reference.md
is generated from them). Task kinds' and workflows' settings live in their modules; this one
assembles them into :class:`Config`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    create_model,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic.fields import FieldInfo

from matrixrl.config.loss_types import LOSS_TYPES, NOT_A_LOSS_TYPE, loss_problem
from matrixrl.errors import ConfigError, did_you_mean, did_you_mean_registered
from matrixrl.settings import ADDED, RUNTIME, Strict, inert_without
from matrixrl.tasks import TASK_KINDS, TASK_SETTINGS
from matrixrl.workflows import WORKFLOWS
from matrixrl.workflows.styles import PromptSettings

AXES = ("workflow", "task", "scale", "policy", "seed")
POLICIES = ("shared", "isolated")

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")


class Grid(Strict):
    """The axes of the experiment matrix; every combination is one cell."""

    workflow: list[str] = Field(
        min_length=1, description=f"workflows to run, each listed once: {', '.join(WORKFLOWS)}"
    )
    task: list[str] = Field(min_length=1, description="tasks to run, by their names under tasks:")
    scale: list[str] = Field(min_length=1, description="model scales to run, by their names under scales:")
    policy: list[str] = Field(
        min_length=1, description="policy modes: shared (one parameter set for every role) or isolated (one per role)"
    )
    seed: list[Annotated[int, Field(ge=0)]] = Field(
        min_length=1,
        description="training seeds; a cell's seed draws its training problems and samples, seeds its initial "
        "adapters and keys its evaluation samples",
    )
    memory: list[str] = Field(
        default_factory=lambda: ["none"],
        min_length=1,
        description="memory modes every checkpoint is evaluated under (MemCollab, docs/memcollab.md): none, own, "
        "transfer, self_contrast, memcollab; modes other than none need a memory: section and chat-style scales. "
        "Training is not multiplied: each mode is one more evaluation of the same checkpoints",
    )
    sweeps: dict[str, Any] = Field(
        default_factory=dict,
        description="extra axes, written as dotted keys right under grid: (e.g. train.lr: [1.0e-4, 5.0e-5]): "
        "any setting a cell computes from, with its values; a cell it does not affect is not multiplied "
        "(docs/sweeps.md)",
    )

    @model_validator(mode="before")
    @classmethod
    def _dotted_keys_are_sweeps(cls, data):
        if isinstance(data, dict) and any("." in str(key) for key in data):
            fixed = {key: value for key, value in data.items() if "." not in str(key)}
            sweeps = {**(fixed.pop("sweeps", None) or {}), **{k: v for k, v in data.items() if "." in str(k)}}
            return {**fixed, "sweeps": sweeps}
        return data

    @model_serializer(mode="wrap")
    def _sweeps_as_dotted_keys(self, handler):
        # Written back as the user writes it (the configfile Snakemake reads, say).
        data = handler(self)
        return {**{k: v for k, v in data.items() if k != "sweeps"}, **(data.get("sweeps") or {})}


def _known_roles(by_role: dict[str, float] | None) -> dict[str, float] | None:
    """A per-role map names roles some workflow has (a scale's ``train:`` may leave it unset)."""
    known = sorted({role for workflow in WORKFLOWS.values() for role in workflow.roles})
    for role in by_role or {}:
        if role not in known:
            raise ValueError(f"unknown role {role!r}; {did_you_mean(role, known)}")
    return by_role


# Before the Literal's own check, whose message has no "did you mean" (a scale's train: gets them too).
def _known_loss_type(value):
    if isinstance(value, str) and value not in LOSS_TYPES:
        fix = NOT_A_LOSS_TYPE.get(value.lower()) or did_you_mean(value, LOSS_TYPES)
        raise ValueError(f"unknown loss type {value!r}; {fix}")
    return value


def _known_level(value):
    if isinstance(value, str) and value not in IMPORTANCE_SAMPLING_LEVELS:
        fix = did_you_mean(value, IMPORTANCE_SAMPLING_LEVELS)
        raise ValueError(f"unknown importance sampling level {value!r}; {fix}")
    return value


AUTO_MICRO_BATCH_TOKENS = 4096
"""``train.micro_batch_tokens: auto`` where the job's GPU is not known or it runs on CPU."""


def _tokens_or_auto(value: int | str | None) -> int | str | None:
    if isinstance(value, str) and value != "auto" or isinstance(value, int) and value < 1:
        raise ValueError(f"give a number of tokens of at least 1, auto, or null (got {value!r})")
    return value


MicroBatchTokens = Annotated[Union[int, str, None], AfterValidator(_tokens_or_auto)]
"""A number of tokens (at least 1), ``auto``, or null (a scale's ``train:`` override keeps the check)."""


class Train(Strict):
    """GRPO settings of every cell (see matrixrl.train.trainer); a scale's ``train:`` overrides them."""

    steps: int = Field(
        40, ge=1, le=1_000_000,  # a bound, not a guess at use: past it the step lists alone exhaust memory
        description="training steps per cell; each rolls out problems_per_step × group_size episodes",
    )
    eval_every: int = Field(
        10, ge=1, description="checkpoint and evaluate every N steps; step 0 (the base model) and the last step always"
    )
    checkpoint_every: int | None = Field(
        None, ge=1, description="extra resume checkpoints every N steps, not evaluated (default: eval_every only)"
    )
    keep_checkpoints: Literal["key", "all"] = Field(
        "key",
        description="which checkpoints stay once all of a cell's evaluations are done (matrixrl.retention): key: "
        "the latest resume point, the peak, the final and the cliff's onset with one evaluated checkpoint on "
        "each side; all: every one. Deleted checkpoints' evaluations stay done and stored",
        json_schema_extra=RUNTIME,
    )
    problems_per_step: int = Field(8, ge=1, description="training problems drawn per step, seeded by (seed, step)")
    group_size: int = Field(
        8, ge=2, description="rollouts per problem: the GRPO group whose rewards set each other's advantages"
    )
    lr: float = Field(
        1e-4,
        gt=0,
        description="AdamW learning rate of every parameter set (betas 0.9/0.99, no weight decay, no schedule); "
        "docs/lr-sweep.md: how the default was chosen",
    )
    ppo_epochs: int = Field(
        1,
        ge=1,
        description="optimisation passes over each step's batch (TRL's num_iterations); the ratio and "
        "its clipping act from the second pass on",
    )
    temperature: float = Field(
        1.0, gt=0, description="training rollouts' sampling temperature; the trained log-probs use it too (logits / T)"
    )
    max_new_tokens: int = Field(
        8, ge=1, description="longest completion of one role call in training, in tokens (EOS stops it sooner)"
    )
    epsilon_low: float = Field(
        0.2,
        ge=0,
        description="lower clip: for a negative advantage the importance ratio counts no lower than 1 − epsilon_low "
        "(inert at ppo_epochs 1, where the ratio is 1)",
    )
    epsilon_high: float = Field(
        0.28,
        ge=0,
        description="upper clip: for a positive advantage the importance ratio counts no higher than "
        "1 + epsilon_high (DAPO's clip-higher; inert at ppo_epochs 1)",
    )
    scale_rewards: bool = Field(
        True,
        description="divide each group's advantages (reward − group mean) by the group's reward std + 1e-4; "
        "false: centre only",
    )
    reward: Literal["outcome", "per_agent"] = Field(
        "outcome",
        description="outcome: the final answer's score for every turn; per_agent: each turn's own "
        "answer (evaluators: whether their verdict was right; others: the outcome)",
    )
    max_grad_norm: float = Field(
        1.0,
        gt=0,
        description="before each AdamW step, a parameter set's gradient is rescaled so that its L2 norm (over all "
        "its parameters together) is at most this",
    )
    threads: int = Field(1, ge=1, description="torch threads per training job", json_schema_extra=RUNTIME)
    # 16384: a default tiny scale's agent never reaches it (at most 8 × 8 rollouts × 3 turns of at most
    # max_length 64 tokens = 12,288), so the recorded tiny-model results stay exactly as they were.
    micro_batch_tokens: MicroBatchTokens = Field(
        16384,
        description="the update passes each agent's turns through the model in micro-batches of at most this "
        "many rows × padded length, gradients accumulated (the same step up to rounding, in bounded memory: "
        "completion logits alone are rows × length × vocabulary floats); null: all of an agent's turns at once; "
        "auto: on a GPU the most the memory estimate leaves on the job's GPU, elsewhere 4096",
        json_schema_extra=RUNTIME,
    )
    rollout_batch_size: int | None = Field(
        None,
        ge=1,
        description="most prompts per generate call of a training rollout (a stage's rows are decoded in chunks "
        "of this many); null: a whole stage at once. Part of a cell's spec: chunks draw their sampling noise in "
        "another order, so the samples differ (not their distribution)",
        json_schema_extra=ADDED,
    )

    # The remedies of docs/design.md §5 (docs/interventions.md), off by default; matrixrl.train.interventions.
    kl_beta: float = Field(
        0.0,
        ge=0,
        description="per-role KL anchor (the study's I1), as TRL 1.16's beta: each of a role's completion tokens "
        "gains β · KL(π_role ‖ π_base) (k3 estimator; with use_bias_correction_kl, times the importance ratio) "
        "in its per-token loss, before loss_type's own normaliser; the reference is the cell's base model; 0: off",
        json_schema_extra=ADDED,
    )
    kl_beta_roles: Annotated[dict[str, Annotated[float, Field(ge=0)]], AfterValidator(_known_roles)] = Field(
        default_factory=dict,
        description="β of named roles (e.g. {aggregator: 0.1}); roles not named get kl_beta",
        json_schema_extra=ADDED,
    )
    use_bias_correction_kl: bool = Field(
        True,
        description="the KL anchor's importance-sampling correction, as TRL 1.16's (same name and default): each "
        "token's KL term is multiplied by the importance ratio, which carries a gradient even where it is 1; "
        "false: the bare k3 term (no effect, and no part of a cell's spec, while no role has a kl_beta)",
        json_schema_extra=inert_without("kl_beta", "kl_beta_roles"),
    )
    damper: float = Field(
        0.0,
        ge=0,
        le=1,
        description="gradient-coherence damper λ (the study's I6): before clipping, each role's gradient g is "
        "scaled by 1 − λ · clamp(cos(g, ḡ), 0, 1), ḡ the moving average of its damped gradient; 0: off "
        "(the study advises λ ≤ 0.3; at 1 a role can freeze)",
        json_schema_extra=ADDED,
    )
    damper_roles: Annotated[dict[str, Annotated[float, Field(ge=0, le=1)]], AfterValidator(_known_roles)] = Field(
        default_factory=dict,
        description="λ of named roles; roles not named get damper",
        json_schema_extra=ADDED,
    )
    damper_window: int = Field(
        10, ge=1, description="window of the damper's moving average ḡ: τ = 1 − 1/window", json_schema_extra=ADDED
    )
    advantage_group: Literal["turn", "agent"] = Field(
        "turn",
        description="what an advantage is normalised over: turn: the same agent's same turn across a problem's "
        "rollouts; agent: all of that agent's turns across them (Dr.MAS's agent-wise normalisation)",
        json_schema_extra=ADDED,
    )

    # The policy loss (names and refusals: matrixrl.config.loss_types; functions: matrixrl.train.losses;
    # docs/design.md §2, "Losses"): TRL 1.16's names and defaults.
    loss_type: Annotated[Literal[LOSS_TYPES], BeforeValidator(_known_loss_type)] = Field(
        "dapo",
        description="the policy loss, by TRL 1.16's name (docs/design.md §2, Losses): dapo (clipped, token-mean "
        "over the step), grpo (clipped, each turn's token-mean averaged over the step's turns), dr_grpo "
        "(clipped, summed, divided by the step's turns × max_new_tokens), bnpo (clipped, token-mean over the "
        "turns of the parameter set being updated), cispo (weight capped at epsilon_high and detached, times "
        "log π), sapo (a soft gate instead of the clip), luspo (clipped sequence ratio, each turn's loss scaled "
        "by its length; sequence level only), vespo (gamma-weighted sequence ratio; token level only)",
        json_schema_extra=ADDED,
    )
    importance_sampling_level: Annotated[Literal[IMPORTANCE_SAMPLING_LEVELS], BeforeValidator(_known_level)] = Field(
        "token",
        description="the importance ratio (inert at ppo_epochs 1, where it is 1): token: one per token; "
        "sequence: one per turn, exp of the mean of its tokens' log-ratios (GSPO with loss_type grpo)",
        json_schema_extra=ADDED,
    )
    sapo_temperature_pos: float = Field(
        1.0, gt=0, description="sapo: the gate's temperature for tokens with a positive advantage",
        json_schema_extra=ADDED,
    )
    sapo_temperature_neg: float = Field(
        1.05, gt=0, description="sapo: the gate's temperature for tokens with an advantage of 0 or less",
        json_schema_extra=ADDED,
    )
    vespo_k_pos: float = Field(
        2.0, ge=0, description="vespo: the weight's power k for an advantage of 0 or more (how hard a ratio "
        "below 1 is down-weighted)", json_schema_extra=ADDED,
    )
    vespo_lambda_pos: float = Field(
        3.0, ge=0, description="vespo: the weight's decay λ for an advantage of 0 or more (how hard a ratio "
        "above 1 is down-weighted)", json_schema_extra=ADDED,
    )
    vespo_k_neg: float = Field(
        3.0, ge=0, description="vespo: the weight's power k for a negative advantage", json_schema_extra=ADDED,
    )
    vespo_lambda_neg: float = Field(
        2.0, ge=0, description="vespo: the weight's decay λ for a negative advantage", json_schema_extra=ADDED,
    )

    @model_validator(mode="after")
    def _loss_settings_agree(self):
        problem = loss_problem(self)
        if problem is not None:
            raise ValueError(problem)
        return self


def _unset(field: FieldInfo) -> FieldInfo:
    """``field`` with no default of its own (None: follow ``train:``)."""
    copied = FieldInfo.merge_field_infos(field)
    copied.default, copied.default_factory = None, None
    return copied


# A scale's ``train:`` section: any key of ``train:``, with the same checks, for that scale's cells.
TrainOverrides = create_model(
    "TrainOverrides",
    __base__=Strict,
    __doc__="Training settings that differ for one scale (e.g. its own lr); unset keys follow ``train:``.",
    **{
        name: (Optional[field.annotation], _unset(field))
        for name, field in Train.model_fields.items()
    },
)


class WarmStart(Strict):
    """The short supervised phase that turns a random tiny model into a base model.

    Next-token training on (prompt, completion) pairs of every task's warm-start
    problems in every workflow's role formats, loss on completion tokens only;
    AdamW with a linear warm-up over the first 5% of the steps, then cosine decay.
    """

    steps: int = Field(400, ge=1, description="optimizer steps of supervised training")
    batch_size: int = Field(64, ge=1, description="(prompt, completion) pairs per step")
    lr: float = Field(3e-3, gt=0, description="peak AdamW learning rate (after the warm-up, before the decay)")
    seed: int = Field(0, ge=0, description="seeds the initial weights and the data")


class TinyScale(Strict):
    """A Qwen3-architecture model built locally from this config (character tokenizer)."""

    kind: Literal["tiny"] = Field(description="tiny: a small model built and warm-started here (CPU)")
    hidden_size: int = Field(128, ge=8, description="width of the residual stream; a multiple of num_heads")
    num_layers: int = Field(2, ge=1, description="transformer decoder layers")
    num_heads: int = Field(4, ge=1, description="attention heads, each hidden_size / num_heads wide")
    num_kv_heads: int = Field(
        2, ge=1, description="key/value heads (grouped-query attention); num_heads must be a multiple of it"
    )
    intermediate_size: int = Field(256, ge=8, description="width of each MLP's hidden layer")
    max_length: int = Field(
        64,
        ge=8,
        description="longest prompt + completion in tokens (characters): the model's positions; warm-start "
        "pairs are cut to it",
    )
    warmstart: WarmStart = Field(WarmStart(), description="the supervised phase that makes the base model")
    prompt_style: Literal["compact", "chat"] = Field("compact", description="tiny models play compact prompts only")
    train: TrainOverrides = Field(
        TrainOverrides(), description="this scale's own training settings (e.g. its lr); unset keys follow train:"
    )

    @model_validator(mode="after")
    def _heads_divide(self):
        if self.prompt_style != "compact":
            raise ValueError(
                f"prompt_style {self.prompt_style!r} needs a chat template, which the character tokenizer "
                "of a tiny scale lacks; use prompt_style: compact, or a kind: hf scale for chat prompts"
            )
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} must be a multiple of num_heads {self.num_heads}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads {self.num_heads} must be a multiple of num_kv_heads {self.num_kv_heads}"
            )
        return self


class HfScale(Strict):
    """A pretrained causal LM: a Hugging Face hub id or a local folder (see matrixrl.models.hf)."""

    kind: Literal["hf"] = Field(description="hf: a pretrained model, used as it is (no warm-start)")
    path: str = Field(
        min_length=1,
        description="hub id (Qwen/Qwen3-0.6B) or folder; a relative folder is relative to the experiments file",
    )
    revision: str | None = Field(None, description="hub revision (branch, tag or commit) of a hub id")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto",
        description="the dtype forward passes compute in (auto: bfloat16 on a GPU, float32 on CPU); weights that "
        "train and their optimizer state stay float32 (docs/real-models.md, Precision)",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto: a GPU when one is visible, else CPU", json_schema_extra=RUNTIME
    )
    prompt_style: Literal["compact", "chat"] = Field("chat", description="chat: the tokenizer's chat template")
    gradient_checkpointing: bool = Field(
        False,
        description="recompute each layer's activations in the update's backward pass instead of keeping them "
        "(transformers' gradient checkpointing): about a third more compute for activations of one layer at a "
        "time; the same gradients",
        json_schema_extra=RUNTIME,
    )
    train: TrainOverrides = Field(
        TrainOverrides(), description="this scale's own training settings (e.g. its lr); unset keys follow train:"
    )

    @field_validator("dtype")
    @classmethod
    def _no_float16_training(cls, dtype: str) -> str:
        if dtype == "float16":
            raise ValueError(
                "float16 needs loss scaling, which matrixrl's update does not do (small gradients would round to "
                "zero and nothing would say so); use bfloat16 (GPUs from NVIDIA Ampere on) or float32"
            )
        return dtype


Scale = Annotated[Union[TinyScale, HfScale], Field(discriminator="kind")]

# One member per task module, from the tasks package's registry (matrixrl.tasks.TASK_KINDS,
# plugins included), sealed as WORKFLOWS is below.
TaskConfig = Annotated[Union[TASK_SETTINGS], Field(discriminator="kind")]
TASK_KINDS.seal("the config schema (matrixrl.config)")


class LoraSettings(Strict):
    """LoRA adapters (PEFT) used when ``policies.adapter`` is ``lora``."""

    rank: int = Field(8, ge=1, description="rank r of each adapter's low-rank update")
    alpha: float = Field(16, gt=0, description="scaling: an adapter's update is multiplied by alpha / rank")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on each adapter's input while training")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        min_length=1,
        description="names of the modules that get adapters (default: the attention projections)",
    )


class Policies(Strict):
    """How both policy modes are built (the grid's ``policy`` axis picks the mode)."""

    adapter: Literal["full", "lora"] = Field(
        "full", description="train whole models (isolated: one copy per role) or LoRA adapters"
    )
    lora: LoraSettings = Field(LoraSettings(), description="the adapters, when adapter is lora")


def workflows_model(registry: dict = WORKFLOWS) -> type[Strict]:
    """The ``workflows:`` section: one entry per workflow of ``registry``, its module's
    ``Settings`` (defaults when left out) described by the workflow's ``description``."""
    return create_model(
        "Workflows",
        __base__=Strict,
        __doc__="Parameters of each workflow (docs/design.md §1); a workflow's cells use its entry.",
        __module__=__name__,
        **{
            name: (workflow.settings_model, Field(workflow.settings_model(), description=workflow.description))
            for name, workflow in registry.items()
        },
    )


# One entry per registered workflow (matrixrl.workflows.WORKFLOWS, plugins included): the
# registry is sealed, so a workflow registered after this would be an error, not a silent gap.
Workflows = workflows_model()
WORKFLOWS.seal("the config schema (matrixrl.config)")


BASE_SAMPLES_TIMES = 4
"""The base model's evaluation samples this many times a checkpoint's completions by default
(docs/report.md: a rise of 0.15 at 128 trials found in 92% of runs instead of 58%)."""


class Evaluate(Strict):
    """How each checkpoint is scored on the task's fixed evaluation set (matrixrl.jobs.evaluate).

    As the study: sampled at ``temperature`` 0.7, accuracy = mean pass@1 over ``samples``
    completions per problem; ``temperature: 0`` decodes greedily (one sample).
    """

    temperature: float = Field(0.7, ge=0, description="sampling temperature; 0 decodes greedily")
    samples: int = Field(2, ge=1, description="completions per problem (default 2; 1 when greedy); accuracy is their mean pass@1")
    base_samples: Optional[int] = Field(
        None,
        ge=1,
        description=f"completions per problem of the base model's one evaluation, every run's reference (default "
        f"{BASE_SAMPLES_TIMES} × samples; 1 when greedy): a cliff's rise is read against it (docs/design.md §4)",
        json_schema_extra=ADDED,
    )
    max_new_tokens: int = Field(
        8, ge=1, description="longest completion of one role call in evaluation, in tokens (EOS stops it sooner)"
    )
    batch_size: int = Field(256, ge=1, description="prompts per generate call", json_schema_extra=RUNTIME)
    threads: int = Field(1, ge=1, description="torch threads per evaluation job", json_schema_extra=RUNTIME)

    @model_validator(mode="before")
    @classmethod
    def _samples_follow_the_temperature(cls, data):
        # Greedy decoding has one distinct completion per problem: samples defaults to 1 there.
        if isinstance(data, dict) and data.get("samples") is None and data.get("temperature") == 0:
            return {**data, "samples": 1}
        return data

    @model_validator(mode="after")
    def _greedy_has_one_sample(self):
        for name in ("samples", "base_samples"):
            if self.temperature == 0 and (getattr(self, name) or 1) > 1:
                raise ValueError(
                    f"{name} {getattr(self, name)} with temperature 0: greedy decoding gives identical completions; "
                    f"use {name}: 1, or a temperature above 0"
                )
        return self

    @property
    def base_samples_in_effect(self) -> int:
        """The base evaluation's completions per problem: ``base_samples``, else its default."""
        if self.base_samples is not None:
            return self.base_samples
        return BASE_SAMPLES_TIMES * self.samples if self.temperature > 0 else 1


class Memory(Strict):
    """MemCollab's memory (docs/memcollab.md): built from a weak and a strong scale's base models.

    Both models solve a task's memory-building problems (drawn from its training
    problems, never its evaluation set); a distiller turns their trajectories into
    "When …, enforce …; avoid …" constraints; a labeller gives every problem a
    (category, subcategory); an evaluation shows each guided role the constraints of
    the ``top_p`` most similar same-label source problems.
    """

    weak: str = Field(min_length=1, description="the weaker model: a chat-style scale under scales:")
    strong: str = Field(min_length=1, description="the stronger model: a chat-style scale under scales:")
    distiller: str | None = Field(None, description="the scale that distils constraints (default: strong, as the paper)")
    labeller: str | None = Field(None, description="the scale that labels problems (default: the distiller)")
    problems: int = Field(
        200, ge=1, description="memory-building problems per task, drawn from its training problems with seed"
    )
    seed: int = Field(42, ge=0, description="draws the building problems and keys sampled trajectories (paper: 42)")
    temperature: float = Field(
        0.0,
        ge=0,
        description="decoding of the one trajectory per problem that own, transfer and memcollab read; 0 is greedy "
        "(the paper); above 0 each model's samples are keyed by its scale name",
    )
    samples: int = Field(4, ge=2, description="self_contrast: sampled trajectories per problem")
    contrast_temperature: float = Field(0.7, gt=0, description="self_contrast: their sampling temperature")
    max_new_tokens: int = Field(512, ge=1, description="longest trajectory, in tokens")
    distill_max_new_tokens: int = Field(256, ge=1, description="longest distiller reply, in tokens")
    distill_prefix: str = Field(
        "1. When",
        description="the distiller's reply is prefilled with this, so it opens with a constraint rather than a "
        "preamble (matrixrl.memcollab.DISTILLER_PREFIX); \"\" for none, e.g. to let a thinking model think first",
    )
    label_max_new_tokens: int = Field(16, ge=1, description="longest labeller reply, in tokens")
    entries_per_problem: int = Field(
        3, ge=1, description="constraints distilled from one source problem, and shown of one at most"
    )
    top_p: int = Field(3, ge=1, description="similar same-label source problems whose constraints a problem is shown")
    limit: int | None = Field(None, ge=1, description="most constraints shown to one problem (default: no cap)")
    roles: Annotated[list[str] | None, AfterValidator(lambda roles: roles and list(_known_roles(dict.fromkeys(roles, 0.0))))] = Field(
        None,
        description="roles whose prompts get the constraints (default: those that write an answer: generator, "
        "aggregator, worker, synthesizer)",
    )
    train: Literal["own", "transfer", "self_contrast", "memcollab"] | None = Field(
        None,
        description="train every cell with this mode's constraints in its guided roles' training prompts (each "
        "training problem labelled by the labeller as it is drawn); an extra axis as grid: {memory.train: [null, "
        "memcollab]}; null: memory at evaluation only",
    )
    batch_size: int = Field(16, ge=1, description="prompts per generate call of memory jobs", json_schema_extra=RUNTIME)
    threads: int = Field(1, ge=1, description="torch threads per memory job", json_schema_extra=RUNTIME)

    @property
    def distiller_scale(self) -> str:
        return self.distiller or self.strong

    @property
    def labeller_scale(self) -> str:
        return self.labeller or self.distiller_scale


MEMORY_MODES = ("none", "own", "transfer", "self_contrast", "memcollab")
ANSWER_ROLES = ("generator", "aggregator", "worker", "synthesizer")


class Analysis(Strict):
    """Thresholds of the report tables (docs/design.md §4, §5; matrixrl.analysis).

    Changing them reruns only the ``analyse`` job (``summary.json``); ``report`` recomputes its per-cell records.
    """

    cliff_delta: float = Field(
        0.10,
        ge=0,
        le=1,
        description="accuracy drop below the peak that counts as a cliff, or below the base as a collapse (0.10: 10 points)",
    )
    cliff_noise_se: float = Field(
        2.0,
        ge=0,
        description="standard errors of the evaluation (per-problem means) the drop must exceed, and a cliff's peak rise over the base",
    )
    final_tail_k: int = Field(3, ge=1, description="last checkpoints averaged into final_tail")
    confidence: float = Field(0.95, gt=0, lt=1, description="level of the Student-t intervals across seeds")
    mechanism_baseline_steps: int = Field(
        5, ge=1, description="first training updates whose mean signal is the cell's baseline"
    )
    mechanism_rise: float = Field(
        0.25, gt=0, description="relative increase over the baseline that counts as a rise (0.25: +25%)"
    )
    mechanism_smooth_steps: int = Field(
        3, ge=1, description="trailing updates averaged before the signal is compared with the baseline"
    )
    family: Literal["none", "holm"] = Field(
        "none", description="claims table: none (each claim at its own level) or holm (Holm's procedure across claims 2-7)"
    )


class Config(Strict):
    """A whole experiments file: the grid's axes and what each cell computes."""

    results_dir: str = Field(
        "results",
        description="folder of the results, checkpoints and the SQLite store; relative to the experiments file",
    )
    grid: Grid = Field(description="the axes; every combination of their values is a cell")
    scales: dict[str, Scale] = Field(description="model scales by name (grid.scale lists the ones to run)")
    tasks: dict[str, TaskConfig] = Field(description="tasks by name (grid.task lists the ones to run)")
    workflows: Workflows = Field(Workflows(), description="each workflow's parameters")
    policies: Policies = Field(Policies(), description="how the shared and isolated policies are built")
    prompts: PromptSettings = Field(PromptSettings(), description="the chat prompt style's limits and switches")
    train: Train = Field(Train(), description="GRPO training of every cell")
    eval: Evaluate = Field(Evaluate(), description="how each evaluated checkpoint is scored")
    analysis: Analysis = Field(Analysis(), description="thresholds of the report's tables")
    memory: Memory | None = Field(
        None, description="MemCollab's memory, read by grid.memory's modes other than none (docs/memcollab.md)"
    )

    @field_validator("results_dir")
    @classmethod
    def _results_dir_named(cls, value: str) -> str:
        if not value.strip():  # "" would silently be the experiments file's own folder
            raise ValueError("must not be empty; write . for the experiments file's folder")
        return value

    @model_validator(mode="after")
    def _grid_values_defined(self):
        known = {
            "workflow": tuple(WORKFLOWS),
            "policy": POLICIES,
            "scale": tuple(self.scales),
            "task": tuple(self.tasks),
        }
        where = {"scale": "define it under 'scales:'", "task": "define it under 'tasks:'"}
        for axis, allowed in known.items():
            for value in getattr(self.grid, axis):
                if value not in allowed:
                    if axis == "workflow":  # a plugin's, maybe
                        fix = did_you_mean_registered(value, allowed)
                    else:
                        fix = did_you_mean(value, allowed, otherwise=where.get(axis, ""))
                    raise ConfigError(f"grid.{axis}: unknown {axis} {value!r}; {fix}")
        for axis in (*AXES, "memory"):
            values = getattr(self.grid, axis)
            if len(set(values)) != len(values):
                raise ConfigError(f"grid.{axis}: values repeat in {values}; list each once")
        self._memory_usable()
        self._scale_losses_run()
        return self

    def _scale_losses_run(self) -> None:
        """A scale's own ``train:`` with ``train:`` under it runs its loss settings together (the
        merge is not validated, and ``train:`` alone was checked)."""
        for name, scale in self.scales.items():
            if not scale.train.model_dump(exclude_none=True):
                continue
            train = self.train_for(name)
            problem = loss_problem(train)
            if problem is not None:
                raise ConfigError(f"scales.{name}.train: {problem}")

    def _memory_usable(self) -> None:
        modes = self.grid.memory
        for mode in modes:
            if mode not in MEMORY_MODES:
                raise ConfigError(f"grid.memory: unknown memory mode {mode!r}; {did_you_mean(mode, MEMORY_MODES)}")
        memory = self.memory
        where = "grid.memory"
        if memory is not None and memory.train is not None:
            modes, where = [*modes, memory.train], "memory.train" if set(modes) == {"none"} else where
        if set(modes) == {"none"}:
            return
        used = ", ".join(dict.fromkeys(m for m in modes if m != "none"))
        if memory is None:
            raise ConfigError(
                f"{where}: {used} needs a memory: section; add memory: {{weak: SCALE, strong: SCALE}} "
                "naming two chat-style scales (docs/memcollab.md)"
            )
        for field in ("weak", "strong", "distiller", "labeller"):
            name = getattr(memory, field)
            if name is None:
                continue
            if name not in self.scales:
                fix = did_you_mean(name, self.scales, otherwise="define it under 'scales:'")
                raise ConfigError(f"memory.{field}: unknown scale {name!r}; {fix}")
            if self.scales[name].prompt_style != "chat":
                raise ConfigError(
                    f"memory.{field}: scale {name!r} plays compact prompts; memory is read as natural-language "
                    "guidance, so it needs a chat-style scale (kind: hf, prompt_style: chat)"
                )
        if memory.weak == memory.strong:
            for mode in ("transfer", "memcollab"):
                if mode in modes:
                    raise ConfigError(
                        f"{where}: {mode} needs two different models, but memory.weak and memory.strong are "
                        f"both {memory.weak!r}; name two scales (they may load the same model)"
                    )
        for scale in self.grid.scale:
            if self.scales[scale].prompt_style != "chat":
                raise ConfigError(
                    f"{where}: {used} on scale {scale!r}, which plays compact prompts; memory needs chat-style "
                    "scales (kind: hf, prompt_style: chat); use grid.memory: [none] for compact scales"
                )
            if scale not in (memory.weak, memory.strong):
                raise ConfigError(
                    f"{where}: scale {scale!r} is neither memory.weak ({memory.weak!r}) nor memory.strong "
                    f"({memory.strong!r}); the memory modes compare what those two models are given"
                )

    def train_for(self, scale: str) -> Train:
        """The training settings of ``scale``'s cells: ``train:`` with the scale's own ``train:`` over it."""
        overrides = self.scales[scale].train.model_dump(exclude_none=True)
        return self.train.model_copy(update=overrides) if overrides else self.train
