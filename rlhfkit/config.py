"""Configuration: dataclasses split by concern, each field documented right under it (that
docstring is the only source of help text). ``RLConfig`` joins them into one flat object, as
TRL's ``GRPOConfig`` is, and fills fields left at ``None`` from the chosen algorithm's preset.
Configs are frozen: nothing changes them at run time.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import textwrap
from dataclasses import dataclass
from pathlib import Path

import yaml

# The algorithms of DESIGN.md are presets of one config — never branches in the loop.
PRESETS: dict[str, dict] = {
    "ppo": dict(use_critic=True, advantage_estimator="gae", policy_loss="ppo_clip", loss_agg="token-mean",
                kl_in_reward=True, kl_estimator="k1", kl_coef=0.05, whiten_advantages=True, group_size=1,
                num_iterations=4),
    "grpo": dict(use_critic=False, advantage_estimator="group", policy_loss="ppo_clip",
                 loss_agg="seq-mean-token-mean", kl_in_reward=False, kl_estimator="k3", kl_coef=0.04,
                 whiten_advantages=False, group_size=4, num_iterations=1),
    "dr_grpo": dict(use_critic=False, advantage_estimator="group_no_std", policy_loss="ppo_clip",
                    loss_agg="seq-mean-token-sum-norm", kl_in_reward=False, kl_estimator="k3", kl_coef=0.0,
                    whiten_advantages=False, group_size=4, num_iterations=1),
    "reinforce": dict(use_critic=False, advantage_estimator="reinforce", policy_loss="vanilla",
                      loss_agg="seq-mean-token-sum", kl_in_reward=True, kl_estimator="k1", kl_coef=0.05,
                      whiten_advantages=False, group_size=1, num_iterations=1),
    "rloo": dict(use_critic=False, advantage_estimator="rloo", policy_loss="vanilla",
                 loss_agg="seq-mean-token-sum", kl_in_reward=True, kl_estimator="k1", kl_coef=0.05,
                 whiten_advantages=False, group_size=4, num_iterations=1),
}


@dataclass(frozen=True)
class ModelConfig:
    dtype: str = "float32"
    """Weights dtype: float32, bfloat16 or float16. bfloat16 halves memory; float32 is the safe CPU default."""
    critic: str = "separate"
    """PPO critic: 'separate' (its own copy of the backbone, as in the reference) or 'shared' (a value head on the policy's backbone: less memory)."""
    device: str = "auto"
    """Where the models run: 'auto' (the GPU when torch sees one, else the CPU), 'cpu', 'cuda', 'cuda:N'."""
    autocast: str | None = None
    """Mixed precision: 'bfloat16' runs generation and forward/backward matmuls in bfloat16 under torch.autocast while weights, gradients and optimizer states stay in `dtype` (use with float32). None: off."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward instead of keeping them: less memory, ~30% more update time."""
    critic_init: str | None = None
    """Directory of a trained reward model to initialise the separate critic from; None: from the policy."""


@dataclass(frozen=True)
class RolloutConfig:
    prompts_per_step: int = 8
    """Distinct prompts sampled per RL step; the batch is prompts_per_step x group_size completions."""
    group_size: int | None = None
    """G completions per prompt (rows g*G .. g*G+G-1 share prompt g). None: the preset's (GRPO/RLOO 4, PPO/REINFORCE 1)."""
    max_new_tokens: int = 32
    """Response length limit in tokens; completions that hit it without EOS count as truncated."""
    max_prompt_length: int | None = None
    """Prompts longer than this (tokens) are cut from the left, keeping their end. None: no limit."""
    temperature: float = 1.0
    """Sampling temperature; log-probs are computed from logits divided by it too (so they match the sampler)."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0: off). Note: log-probs ignore the truncation, as in TRL and verl."""
    top_k: int = 0
    """Top-k sampling (0: off)."""


@dataclass(frozen=True)
class AlgorithmConfig:
    algorithm: str = "grpo"
    """Preset: ppo, grpo, dr_grpo, reinforce or rloo. Any field below left at None takes the preset's value."""
    advantage_estimator: str | None = None
    """Name in ADVANTAGE_ESTIMATORS: gae, group, group_no_std, rloo, reinforce, reinforce_plus_plus."""
    policy_loss: str | None = None
    """Name in POLICY_LOSSES: ppo_clip (clipped surrogate) or vanilla (plain policy gradient)."""
    loss_agg: str | None = None
    """Loss aggregation: token-mean, seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm."""
    loss_horizon: int | None = None
    """Constant divisor for seq-mean-token-sum-norm (Dr.GRPO); None: max_new_tokens."""
    use_critic: bool | None = None
    """Train a value model (PPO). Required by the gae estimator."""
    kl_coef: float | None = None
    """β of the KL penalty to the reference policy; 0 turns the reference off entirely."""
    kl_estimator: str | None = None
    """k1, k2, k3 or abs (Schulman 2020). PPO puts k1 in the reward; GRPO puts k3 in the loss."""
    kl_in_reward: bool | None = None
    """True: -β·KL is added to every token's reward. False: β·KL is added to the loss (GRPO)."""
    adaptive_kl: bool = False
    """Adapt β towards kl_target (Ziegler et al. 2019) instead of keeping it fixed."""
    kl_target: float = 6.0
    """Target KL (nats per sequence) of the adaptive controller."""
    kl_horizon: float = 10000.0
    """Horizon of the adaptive controller (samples); larger moves β more slowly."""
    clip_low: float = 0.2
    """PPO clip ε below 1 (ratio floor 1-ε)."""
    clip_high: float = 0.2
    """PPO clip ε above 1 (ratio ceiling 1+ε); DAPO's clip-higher uses 0.28."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 for negative advantages (Ye et al. 2020); None: off."""
    value_clip: float | None = 0.2
    """Clip range of the value update around the old values (cliprange_value); None: plain MSE."""
    vf_coef: float = 0.5
    """Weight of the value loss in the total loss (c1 of the PPO paper)."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (c2 of the PPO paper); 0 computes entropy as a metric only."""
    gamma: float = 1.0
    """Discount of GAE and REINFORCE++ returns; 1 is standard for LM episodes."""
    lam: float = 0.95
    """GAE λ."""
    whiten_advantages: bool | None = None
    """Whiten advantages over the batch's response tokens (PPO)."""
    num_iterations: int | None = None
    """K: passes (PPO epochs) over each batch; old log-probs are kept from before the first update."""
    missing_eos_penalty: float | None = None
    """Score given to completions that never emit EOS (the EOS trick, e.g. -1). None: off."""
    reward_clip: float | None = None
    """Clip scores to [-reward_clip, reward_clip] before advantages. None: off."""
    normalize_rewards: bool = False
    """Whiten scores over the batch before advantages."""


@dataclass(frozen=True)
class OptimConfig:
    learning_rate: float = 1e-5
    """AdamW learning rate of the policy."""
    critic_learning_rate: float | None = None
    """AdamW learning rate of the critic; None: learning_rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float | None = 1.0
    """Clip the global gradient norm to this; None: off."""
    warmup_steps: int = 0
    """Linear learning-rate warmup, in optimizer steps."""
    lr_scheduler: str = "constant"
    """constant, linear or cosine decay to 0 (after warmup)."""
    mini_batch_size: int | None = None
    """Rows per optimizer step; None: the whole batch (one step per pass)."""
    micro_batch_size: int | None = None
    """Rows per forward/backward (gradient accumulation inside a mini-batch); None: the mini-batch."""


@dataclass(frozen=True)
class RunConfig:
    max_steps: int = 100
    """RL steps (each: generate, score, update)."""
    seed: int = 0
    """Seed of torch, numpy and Python's random, and of the prompt order."""
    output_dir: str | None = None
    """Run directory (metrics.jsonl, checkpoints, final model); None: nothing is written."""
    save_steps: int = 0
    """Write a checkpoint every this many steps (0: only the final model)."""
    resume_from: str | None = None
    """Checkpoint directory to continue from (weights, optimizer, scheduler, RNG, data position)."""
    log_every: int = 1
    """Print a progress line every this many steps (0: silent)."""
    progress_bar: bool = True
    """On a terminal, show a progress bar with ETA and the main metric; False (--quiet): log lines only."""
    overwrite: bool = False
    """Allow output_dir to exist and hold files already (they may be replaced). False: refuse, so no run is lost."""
    num_logged_samples: int = 4
    """Completions written to samples.jsonl (for the report) at each of ~10 evenly spaced steps."""


@dataclass(frozen=True)
class RLConfig(RunConfig, OptimConfig, AlgorithmConfig, RolloutConfig, ModelConfig):
    """Everything an RL run reads. ``RLConfig(algorithm="rloo", kl_coef=0.1)``."""

    def __post_init__(self):
        if self.algorithm not in PRESETS:
            raise ValueError(f"algorithm must be one of {', '.join(PRESETS)}, got {self.algorithm!r}")
        for key, value in PRESETS[self.algorithm].items():
            if getattr(self, key) is None:
                object.__setattr__(self, key, value)
        _validate(self)

    @property
    def batch_size(self) -> int:
        return self.prompts_per_step * self.group_size

    def replace(self, **changes) -> "RLConfig":
        """A copy with ``changes``. Switching ``algorithm`` also resets the fields that still hold the
        old preset's values, so the new preset fills them (not the old algorithm's settings)."""
        new_algorithm = changes.get("algorithm", self.algorithm)
        if new_algorithm != self.algorithm and new_algorithm in PRESETS:
            for key, value in PRESETS[self.algorithm].items():
                if key not in changes and getattr(self, key) == value:
                    changes[key] = None
        return dataclasses.replace(self, **changes)


def _validate(c: RLConfig) -> None:
    from .algorithms import ADVANTAGE_ESTIMATORS, AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES

    ADVANTAGE_ESTIMATORS.get(c.advantage_estimator)
    POLICY_LOSSES.get(c.policy_loss)
    KL_ESTIMATORS.get(c.kl_estimator)
    checks = [
        (c.loss_agg in AGGREGATIONS, "loss_agg", f"one of {', '.join(AGGREGATIONS)}"),
        (c.group_size >= 1, "group_size", ">= 1"),
        (c.advantage_estimator not in ("group", "group_no_std", "rloo") or c.group_size >= 2, "group_size",
         f">= 2 for the {c.advantage_estimator!r} estimator"),
        (c.advantage_estimator != "gae" or c.use_critic, "use_critic", "True for the 'gae' estimator"),
        (not c.use_critic or c.advantage_estimator in ("gae", "reinforce_plus_plus"), "use_critic",
         f"False for the {c.advantage_estimator!r} estimator (it gives the critic no returns to learn)"),
        (c.max_prompt_length is None or c.max_prompt_length >= 1, "max_prompt_length", ">= 1 or None"),
        (c.device == "auto" or c.device.split(":")[0] in ("cpu", "cuda", "mps", "xpu"), "device",
         "'auto', 'cpu', 'cuda' (or 'cuda:N'), 'mps' or 'xpu'"),
        (c.prompts_per_step >= 1, "prompts_per_step", ">= 1"),
        (c.max_new_tokens >= 1, "max_new_tokens", ">= 1"),
        (c.temperature > 0, "temperature", "> 0"),
        (0 < c.top_p <= 1, "top_p", "in (0, 1]"),
        (c.kl_coef >= 0, "kl_coef", ">= 0"),
        (c.num_iterations >= 1, "num_iterations", ">= 1"),
        (c.max_steps >= 0, "max_steps", ">= 0"),
        (c.learning_rate > 0, "learning_rate", "> 0"),
        (c.lr_scheduler in ("constant", "linear", "cosine"), "lr_scheduler", "'constant', 'linear' or 'cosine'"),
        (c.critic in ("separate", "shared"), "critic", "'separate' or 'shared'"),
        (c.dtype in ("float32", "bfloat16", "float16"), "dtype", "float32, bfloat16 or float16"),
        (c.autocast in (None, "bfloat16", "float16"), "autocast", "None, 'bfloat16' or 'float16'"),
        (c.mini_batch_size is None or 1 <= c.mini_batch_size <= c.batch_size, "mini_batch_size",
         f"between 1 and the batch size {c.batch_size}"),
        (c.micro_batch_size is None or c.micro_batch_size >= 1, "micro_batch_size", ">= 1"),
    ]
    check_fields(c, checks)



@dataclass(frozen=True)
class TrainConfig:
    """Fields shared by the supervised trainers (SFT, reward model); each subclass re-declares the
    fields whose defaults differ."""

    learning_rate: float = 2e-5
    """AdamW peak learning rate."""
    num_epochs: float = 1.0
    """Passes over the training data when max_steps is None (fractions allowed)."""
    max_steps: int | None = None
    """Optimizer steps to run; None: from num_epochs."""
    batch_size: int = 8
    """Rows per step."""
    max_length: int = 1024
    """Tokens per sequence (prompt + completion + EOS); longer: the prompt's start goes first."""
    warmup_steps: int = 0
    """Linear learning-rate warmup, in optimizer steps."""
    lr_scheduler: str = "cosine"
    """After warmup: constant, linear (decay to 0 at the last step) or cosine (Loshchilov & Hutter 2017)."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay on every trainable parameter (norms and biases too)."""
    max_grad_norm: float | None = 1.0
    """Clip the global gradient norm to this; None: off."""
    eval_every: int = 0
    """Evaluate on eval_dataset every this many optimizer steps (0: only after the last step)."""
    seed: int = 0
    """Seed of torch, numpy and Python's random and of the per-epoch data order."""
    output_dir: str | None = None
    """Run directory (config.yaml, metrics.jsonl, plots/, final/); None: nothing is written."""
    log_every: int = 10
    """Print a progress line every this many steps (0: silent); metrics.jsonl gets every step."""
    dtype: str = "float32"
    """Weights dtype when the model is loaded from a directory: float32, bfloat16 or float16."""
    progress_bar: bool = True
    """On a terminal, show a progress bar with ETA and the main metric; False (--quiet): log lines only."""
    overwrite: bool = False
    """Allow output_dir to exist and hold files already (they may be replaced). False: refuse, so no run is lost."""

    def __post_init__(self):
        check_fields(self, [
            (self.learning_rate > 0, "learning_rate", "> 0"),
            (self.num_epochs > 0, "num_epochs", "> 0"),
            (self.max_steps is None or self.max_steps >= 0, "max_steps", ">= 0 or None"),
            (self.batch_size >= 1, "batch_size", ">= 1"),
            (self.max_length >= 2, "max_length", ">= 2"),
            (self.warmup_steps >= 0, "warmup_steps", ">= 0"),
            (self.lr_scheduler in ("constant", "linear", "cosine"), "lr_scheduler", "constant, linear or cosine"),
            (self.weight_decay >= 0, "weight_decay", ">= 0"),
            (self.max_grad_norm is None or self.max_grad_norm > 0, "max_grad_norm", "> 0 or None"),
            (self.eval_every >= 0, "eval_every", ">= 0"),
            (self.log_every >= 0, "log_every", ">= 0"),
            (self.dtype in ("float32", "bfloat16", "float16"), "dtype", "float32, bfloat16 or float16"),
        ])

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


def check_fields(config, checks) -> None:
    """Raise for the first ``(ok, field, expected)`` that fails, naming the config and the field."""
    for ok, name, expected in checks:
        if not ok:
            raise ValueError(f"{type(config).__name__}: config field {name!r} must be {expected}, "
                             f"got {getattr(config, name)!r}")

# ---------------------------------------------------------------------------------------------
# Help text, YAML files and key=value overrides — generic over any frozen dataclass config.


def field_docs(cls) -> dict[str, str]:
    """Field name -> the docstring right under the field, read from the source of every dataclass in
    ``cls.__mro__`` (a subclass's docstring wins); ``""`` for an undocumented field."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is not object and dataclasses.is_dataclass(klass):
            docs.update(_class_field_docs(klass))
    return {f.name: docs.get(f.name, "") for f in dataclasses.fields(cls)}


def _class_field_docs(klass) -> dict[str, str]:
    try:
        source = textwrap.dedent(inspect.getsource(klass))
    except (OSError, TypeError):  # no source (built in a REPL, or from a .pyc only): no docs
        return {}
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef))
    docs = {}
    for stmt, nxt in zip(node.body, node.body[1:]):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            docs[stmt.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def _defining_class(cls, name: str):
    return next(k for k in cls.__mro__ if name in inspect.get_annotations(k))


def format_help(cls) -> str:
    """Every field with its type, default and docstring, grouped by the class that defines it."""
    docs = field_docs(cls)
    groups: dict[str, list[str]] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        title = _defining_class(cls, f.name).__name__.removesuffix("Config") or cls.__name__
        if f.default is not dataclasses.MISSING:
            default = f"default {f.default!r}"
        elif f.default_factory is not dataclasses.MISSING:
            default = f"default {f.default_factory()!r}"
        else:
            default = "required"
        lines = [f"  {f.name} ({f.type}, {default})"]
        if docs[f.name]:
            lines.append(textwrap.fill(docs[f.name], width=100, initial_indent=" " * 6,
                                       subsequent_indent=" " * 6))
        groups.setdefault(title, []).extend(lines)
    header = f"{cls.__name__} fields: set them in a YAML file or as key=value overrides."
    return "\n\n".join([header] + [f"{title}:\n" + "\n".join(lines) for title, lines in groups.items()])


def load_config(cls, path=None, overrides=()):
    """``cls`` built from a YAML file (a mapping of field names to values), then ``key=value``
    overrides (values parsed as YAML: ``kl_coef=0.1``, ``dual_clip=null``, ``adaptive_kl=true``).
    Every mistake is a one-line ``ValueError``; the config's own validation runs last, unchanged."""
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    sources = []
    if path is not None:
        sources.append((f"file {path}", _read_yaml_mapping(Path(path))))
    sources.append(("the command line", _parse_overrides(overrides)))
    values = {}
    for source, mapping in sources:
        for key, value in mapping.items():
            if key not in fields:
                raise ValueError(_unknown_key_message(key, value, fields, source))
            values[key] = _check_type(key, value, fields[key].type, source)
    return cls(**values)


def _read_yaml_mapping(path: Path) -> dict:
    if not path.is_file():
        raise ValueError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = " ".join(str(getattr(e, "problem", None) or e).split())
        context, context_mark = getattr(e, "context", None), getattr(e, "context_mark", None)
        if context and context_mark is not None and mark is not None and context_mark.line != mark.line:
            problem += f" ({' '.join(context.split())} on line {context_mark.line + 1})"
        raise ValueError(f"{where}: YAML syntax error: {problem}") from None
    if data is None:  # an empty file: all defaults
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the top level must be a mapping of field names to values, "
                         f"got {type(data).__name__}")
    return data


def _parse_overrides(overrides) -> dict:
    if isinstance(overrides, str):  # a lone "k=v" would otherwise be iterated character by character
        overrides = [overrides]
    parsed = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"override {item!r} must be key=value (e.g. kl_coef=0.1)")
        try:
            parsed[key.strip()] = yaml.safe_load(raw)
        except yaml.YAMLError:
            raise ValueError(f"override {item!r}: the value does not parse as YAML") from None
    return parsed


def _unknown_key_message(key, value, fields, source: str) -> str:
    close = difflib.get_close_matches(str(key), list(fields), n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    if isinstance(value, dict):
        hint += " (sections are not supported: write fields at the top level)"
    return f"unknown config key {key!r} from {source}{hint}"


def _check_type(key: str, value, annotation, source: str):
    """``value`` converted to the field's annotation (a string under postponed annotations)."""
    ok, converted = _convert(value, str(annotation).replace(" ", ""))
    if not ok:
        raise ValueError(f"config key {key!r} from {source} expects {annotation}, "
                         f"got {value!r} ({type(value).__name__})")
    return converted


def _split_top(text: str, sep: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "["
        depth -= ch == "]"
        if ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


def _convert(value, ann: str) -> tuple[bool, object]:
    if ann.startswith("Optional[") and ann.endswith("]"):
        ann = ann[len("Optional["):-1] + "|None"
    options = _split_top(ann, "|")
    if len(options) > 1:
        if value is None and "None" in options:
            return True, None
        for option in options:
            if option != "None":
                ok, converted = _convert(value, option)
                if ok:
                    return True, converted
        return False, value
    if ann == "bool":
        return isinstance(value, bool), value
    if ann == "int":
        return isinstance(value, int) and not isinstance(value, bool), value
    if ann == "float":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return True, float(value)
        # PyYAML reads 1e-5 (no dot) as a string, following YAML 1.1; accept what float() reads.
        try:
            return isinstance(value, str), float(value)
        except (TypeError, ValueError):
            return False, value
    if ann == "str":
        return isinstance(value, str), value
    if ann == "None":
        return value is None, value
    for kind, make in (("tuple", tuple), ("list", list)):
        if ann.startswith(kind + "[") and ann.endswith("]"):
            return _convert_sequence(value, _split_top(ann[len(kind) + 1:-1], ","), make)
    return True, value  # an annotation this reader does not know: the config's validation decides


def _convert_sequence(value, items: list[str], make) -> tuple[bool, object]:
    if not isinstance(value, (list, tuple)):
        return False, value
    if len(items) == 2 and items[1] == "...":
        items = [items[0]] * len(value)
    elif len(items) == 1 and make is list:
        items = items * len(value)
    if len(items) != len(value):
        return False, value
    out = []
    for v, item in zip(value, items):
        ok, converted = _convert(v, item)
        if not ok:
            return False, value
        out.append(converted)
    return True, make(out)


def save_config(config, path) -> Path:
    """The resolved config (presets filled) as YAML; ``load_config(type(config), path)`` returns an
    equal config."""
    def plain(v):
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = dataclasses.asdict(config)
    values = {f.name: plain(data[f.name]) for f in dataclasses.fields(config) if f.init}
    path.write_text(yaml.safe_dump(values, sort_keys=False, allow_unicode=True))
    return path
