"""TRL 1.16's ``DPOConfig`` and ``DPOTrainer`` on rlhfkit's DPO trainer.

The config is TRL's dataclass (``transformers.TrainingArguments`` plus TRL's fields, defaults and
checks); ``to_rlhfkit`` is the one table that maps it to rlhfkit's ``DPOConfig``, with the batch
arithmetic of ``supervised.py`` (``per_device_train_batch_size`` pairs per process per micro-step).
Every TRL ``loss_type`` is a formula of rlhfkit's algorithm core (``algorithms/dpo.py``), one or a
list weighted by ``loss_weights``; so are ``f_divergence_type``, ``ld_alpha``, WPO's ``use_weighting`` and TR-DPO's
``sync_ref_model`` (``trainers/dpo_reference.py``). The data are
TRL's too (``_encode``): text rows are tokenised as TRL tokenises them (``supervised.trl_encode``:
the tokenizer's special tokens, no second EOS), and ``max_length`` truncates as TRL's ``keep_start``.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field

from ..config.supervised import DPOConfig as NativeDPOConfig
from ..data.encode import Encoded, note_cut, note_unknown, warn_once
from ..data.preferences import load_preference_dataset
from ..trainers.dpo import DPOTrainer as NativeDPOTrainer
from ..trainers.dpo import PreferencePair
from .callbacks import trl_callbacks
from .data_forms import eval_label, eval_sets, is_iterable_dataset
from .metrics import DPO_METRICS
from .supervised import SupervisedArguments, SupervisedTRLTrainer, trl_encode

# TRL 1.16's loss_type names, each rlhfkit's of the same name (algorithms/dpo.py): the same per-pair loss of
# the same log-probs. TRL's 'sigmoid' ignores label_smoothing (rlhfkit's reads it: conservative DPO), so
# the drop-in gives it none; the others that read it (robust, exo_pair, aot, aot_unpaired) read it alike.
LOSS_TYPES = (
    "sigmoid",
    "hinge",
    "ipo",
    "exo_pair",
    "nca_pair",
    "robust",
    "bco_pair",
    "sppo_hard",
    "aot",
    "aot_unpaired",
    "apo_zero",
    "apo_down",
    "discopop",
    "sft",
    "sigmoid_norm",
)
SMOOTHED = ("robust", "exo_pair", "aot", "aot_unpaired")  # TRL's losses that read label_smoothing


@dataclass
class DPOConfig(SupervisedArguments):
    """TRL 1.16's ``DPOConfig``: its fields, defaults and checks; ``to_rlhfkit`` gives the
    rlhfkit ``DPOConfig`` it runs as (docs: "Coming from TRL")."""

    learning_rate: float = 1e-6
    router_aux_loss_coef: float | None = None
    disable_dropout: bool = True
    truncation_mode: str = "keep_start"
    padding_free: bool = False
    precompute_ref_log_probs: bool = False
    precompute_ref_batch_size: int | None = None
    loss_type: list[str] = field(default_factory=lambda: ["sigmoid"])
    loss_weights: list[float] | None = None
    ld_alpha: float | None = None
    f_divergence_type: str = "reverse_kl"
    f_alpha_divergence_coef: float = 0.5
    label_smoothing: float = 0.0
    beta: float = 0.1
    use_weighting: bool = False
    discopop_tau: float = 0.05
    sync_ref_model: bool = False
    ref_model_mixup_alpha: float = 0.6
    ref_model_sync_steps: int = 512

    # Translated by to_rlhfkit; TRL 1.16 itself ignores padding_free (it falls back to padding), and
    # precompute_ref_batch_size only sets how many pairs one reference pass scores. Any other: default only.
    HANDLED = SupervisedArguments.HANDLED | {
        "disable_dropout",
        "padding_free",
        "precompute_ref_log_probs",
        "precompute_ref_batch_size",
        "loss_type",
        "loss_weights",
        "label_smoothing",
        "beta",
        "discopop_tau",
        "f_divergence_type",
        "f_alpha_divergence_coef",
        "ld_alpha",
        "use_weighting",
        "sync_ref_model",
        "ref_model_mixup_alpha",
        "ref_model_sync_steps",
    }

    def __post_init__(self):
        if isinstance(self.loss_type, str):  # TRL's rule: one name is a list of one
            self.loss_type = [self.loss_type]
        if self.loss_weights is not None and len(self.loss_weights) != len(self.loss_type):  # TRL's check
            raise ValueError(
                "`loss_weights` must have the same length as `loss_type` when combining multiple losses. "
                f"Got {len(self.loss_weights)} weights for {len(self.loss_type)} loss types."
            )
        super().__post_init__()
        unknown = [name for name in self.loss_type if name not in LOSS_TYPES]
        if unknown or not self.loss_type:
            raise ValueError(
                f"DPOConfig field 'loss_type'={self.loss_type!r} is not supported by rlhfkit: one or several of "
                f"{', '.join(map(repr, LOSS_TYPES))} (rlhfkit's own DPOConfig also has 'simpo')"
            )
        if self.label_smoothing and "sigmoid" in self.loss_type and set(self.loss_type) & set(SMOOTHED):
            raise ValueError(
                f"DPOConfig field 'label_smoothing'={self.label_smoothing} with loss_type={self.loss_type!r} is not "
                "supported by rlhfkit: TRL's 'sigmoid' ignores it while the others read it, and rlhfkit's sigmoid "
                "reads it (conservative DPO); use 'robust' in place of 'sigmoid' for a smoothed DPO term"
            )
        if self.use_weighting and {"aot", "aot_unpaired"} & set(self.loss_type):
            raise NotImplementedError(  # TRL's message
                "WPO-style weighting is not implemented for 'aot' or 'aot_unpaired' because those losses sort "
                "samples, which would misalign per-pair weights."
            )
        if self.sync_ref_model and self.precompute_ref_log_probs:
            raise ValueError(  # TRL's message
                "You cannot use `sync_ref_model=True` together with `precompute_ref_log_probs=True`. "
                "`precompute_ref_log_probs=True` assumes a fixed reference model, but with `sync_ref_model=True` "
                "the reference model is periodically updated during training, making any precomputed reference "
                "log-probs stale. Set `precompute_ref_log_probs=False` or disable `sync_ref_model`."
            )
        if not self.disable_dropout:
            raise ValueError(
                "DPOConfig field 'disable_dropout'=False is not supported by rlhfkit: its DPO always "
                "turns dropout off (the implicit rewards must not be noise)"
            )

    def to_rlhfkit(self, n_rows: int, world: int = 1) -> NativeDPOConfig:
        """The rlhfkit ``DPOConfig`` of this config for ``n_rows`` pairs on ``world`` processes."""
        smoothed = bool(set(self.loss_type) & set(SMOOTHED))
        if self.label_smoothing and not smoothed:
            warn_once(
                f"DPOConfig: label_smoothing={self.label_smoothing} has no effect with loss_type "
                f"{self.loss_type!r} in TRL 1.16 (its 'robust', 'exo_pair' and 'aot' losses read it), nor here"
            )
        fields = self.supervised_fields(n_rows, world)
        fields.update(
            loss_type=tuple(self.loss_type) if len(self.loss_type) > 1 else self.loss_type[0],
            loss_weights=None if self.loss_weights is None else tuple(self.loss_weights),
            beta=self.beta,
            label_smoothing=self.label_smoothing if smoothed else 0.0,  # TRL's sigmoid ignores it
            discopop_tau=self.discopop_tau,
            f_divergence_type=self.f_divergence_type,
            f_alpha_divergence_coef=self.f_alpha_divergence_coef,
            ld_alpha=self.ld_alpha,
            use_weighting=self.use_weighting,
            precompute_ref_logprobs=self.precompute_ref_log_probs,
            sync_ref_model=self.sync_ref_model,
            ref_model_mixup_alpha=self.ref_model_mixup_alpha,
            ref_model_sync_steps=self.ref_model_sync_steps,
        )
        return NativeDPOConfig(**fields)


class DPOTrainer(SupervisedTRLTrainer, NativeDPOTrainer):
    """TRL's ``DPOTrainer(model, ref_model, args, data_collator, train_dataset, eval_dataset,
    processing_class, compute_metrics, callbacks, optimizers, quantization_config, peft_config)`` on
    rlhfkit's DPO trainer. ``args``: a ``DPOConfig`` (default: TRL's, writing to ``<model name>-DPO``);
    ``ref_model``: None is a frozen copy of the initial model (with ``peft_config``: the model with
    its adapter off; with ``precompute_ref_log_probs``: the model itself before its first update), as
    in TRL; ``trainer.ref_model`` is the reference model kept (None when there is none)."""

    config_class, suffix, loss_key = DPOConfig, "DPO", "dpo/loss"
    trl_table = DPO_METRICS
    trl_eval_attr = "eval_pairs"  # the rlhfkit trainer's tokenised evaluation set
    # TRL's flag for a Mixture-of-Experts load-balancing loss added to the DPO loss: rlhfkit adds none
    # (docs/guides/trl.md), so it is False for every model.
    aux_loss_enabled = False

    def __init__(
        self,
        model,
        ref_model=None,
        args=None,
        data_collator=None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        compute_metrics=None,
        callbacks=None,
        optimizers=(None, None),
        quantization_config=None,
        peft_config=None,
    ):
        refused = dict(
            data_collator=data_collator, compute_metrics=compute_metrics, quantization_config=quantization_config
        )
        if getattr(args, "precompute_ref_log_probs", False):
            for dataset in (train_dataset, *eval_sets(eval_dataset).values()):
                _no_stream_to_precompute(dataset)
        native, eval_dataset = self.native(
            model, args, train_dataset, eval_dataset, lambda d: len(load_preference_dataset(d)), optimizers, refused
        )
        tokenizer = self.trl_tokenizer(model, processing_class, pad_token=self.trl_args.pad_token)
        super().__init__(
            model,
            native,
            train_dataset,
            eval_dataset,
            processing_class=tokenizer,
            ref_model=ref_model,
            peft_config=peft_config,
            callbacks=trl_callbacks(callbacks, self),
        )

    @property
    def ref_model(self):
        """TRL's ``trainer.ref_model``: the reference model (None under LoRA, where the base model
        with its adapter off is the reference, and with ``precompute_ref_log_probs`` and no
        ``ref_model``, where the model before its first update scored the pairs)."""
        return self.reference

    def _pairs_to_precompute(self) -> list[PreferencePair]:
        """With ``precompute_ref_log_probs``, TRL scores its evaluation sets at init too: the pairs of
        each (tokenised again once the trainer is built, where their warnings are said)."""
        evals: dict = getattr(self, "_trl_inputs", (None, {}))[1]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return [p for name, rows in evals.items() for p in self._encode(rows, eval_label(name))]

    def trl_prepare_eval(self, dataset, name: str) -> list:
        """A dataset given to ``evaluate``: TRL's refusals with ``precompute_ref_log_probs`` (a stream;
        the reference gone once training has started, the policy having been it), then read as
        the trainer's own evaluation sets."""
        if self.args.precompute_ref_logprobs and self.needs_reference:
            _no_stream_to_precompute(dataset)
            if not self._reference_available():
                raise ValueError(  # TRL's message
                    "Cannot compute reference log-probs for a dataset passed to `evaluate()` after training has "
                    "started, because `precompute_ref_log_probs=True` and no `ref_model` was provided (full "
                    "fine-tuning). In this setup the reference model is not kept in memory, so it is only "
                    "available before training. Provide this dataset as `eval_dataset` at initialization, pass an "
                    "explicit `ref_model`, or set `precompute_ref_log_probs=False`."
                )
        return super().trl_prepare_eval(dataset, name)

    def _encode(self, rows: list[dict], name: str) -> list[PreferencePair]:
        """TRL's tokens (``_trl_ids``) and truncation (``truncation_mode="keep_start"``), not
        rlhfkit's (which cuts a long prompt's start and drops a pair whose completion does not fit):
        each sequence, prompt + completion + EOS, keeps its first ``max_length`` tokens, so a long
        completion loses its end and its EOS; a pair whose prompt alone fills ``max_length`` is
        dropped."""
        pairs, cut, limit = [], 0, self.args.max_length
        for i, row in enumerate(rows):
            try:
                chosen, rejected = self._trl_ids(row)
            except ValueError as e:  # e.g. chat messages and a tokenizer without a chat template
                raise ValueError(f"{name}: pair {i} (0-based): {e}") from None
            shared = min(chosen.prompt_len, rejected.prompt_len)  # TRL's: where either completion starts
            prompt = chosen.input_ids[:shared]
            if len(prompt) >= limit:
                continue
            room = limit - len(prompt)
            completions = chosen.input_ids[shared:], rejected.input_ids[shared:]
            cut += max(map(len, completions)) > room
            pairs.append(PreferencePair(prompt, *(c[:room] for c in completions)))
        note_cut(name, cut, len(pairs), "pairs", limit, "a completion's end, TRL's keep_start")
        note_unknown(name, [(p.prompt, p.chosen, p.rejected) for p in pairs], self.tokenizer, "pairs")
        return self.trl_kept_pairs(pairs, len(rows) - len(pairs), len(rows), name, limit, "whose prompt fills")

    def _trl_ids(self, row: dict) -> tuple[Encoded, Encoded]:
        """Prompt + chosen and prompt + rejected as TRL 1.16's DPO tokenises them, each with the
        length of its common prefix with the prompt's tokens. Text: ``trl_encode``. Chat messages:
        the prompt through the chat template with the generation prompt, and the whole conversation
        (prompt, then completion) without, each with the row's ``tools`` (a list or its JSON) and
        ``chat_template_kwargs`` — no EOS added (the template ends the turn)."""
        if not isinstance(row["prompt"], list):
            return trl_encode(row["prompt"], row["chosen"], self.tokenizer), trl_encode(
                row["prompt"], row["rejected"], self.tokenizer
            )
        chosen, rejected = trl_chat_ids(row, [row["chosen"], row["rejected"]], self.tokenizer)
        return chosen, rejected


def trl_chat_ids(row: dict, completions: list, tokenizer) -> list[Encoded]:
    """Each of ``completions`` (message lists) after the row's chat ``prompt`` as TRL 1.16's DPO and
    KTO tokenise them: the prompt through the chat template with the generation prompt, the whole
    conversation (prompt, then completion) without, each with the row's ``tools`` (a list or its
    JSON) and ``chat_template_kwargs``; the completion starts where the two diverge (``after_prompt``)."""
    tools = row.get("tools")
    try:
        tools = json.loads(tools) if isinstance(tools, str) else tools
    except json.JSONDecodeError as e:
        raise ValueError(f"field 'tools': invalid JSON: {e.msg}") from None
    kwargs = {"tools": tools, **(row.get("chat_template_kwargs") or {})}
    tokens = lambda messages, **more: list(  # noqa: E731
        tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, **kwargs, **more)["input_ids"]
    )
    prompt = tokens(list(row["prompt"]), add_generation_prompt=True)
    return [after_prompt(prompt, tokens(list(row["prompt"]) + list(c))) for c in completions]


def after_prompt(prompt: list[int], ids: list[int]) -> Encoded:
    """``ids``, its completion starting where it and ``prompt`` diverge (TRL's ``common_prefix_length``)."""
    n = next((j for j, (a, b) in enumerate(zip(prompt, ids)) if a != b), min(len(prompt), len(ids)))
    return Encoded(ids, n, False, False)


def _no_stream_to_precompute(dataset) -> None:
    """TRL caches reference log-probs by row index, which a stream (``datasets.IterableDataset``,
    also inside a dict of evaluation sets) does not have; its message."""
    streams = eval_sets(dataset).values() if isinstance(dataset, dict) else (dataset,)
    if any(is_iterable_dataset(d) for d in streams):
        raise ValueError(
            "`precompute_ref_log_probs=True` is not supported with IterableDataset. Please use a map-style "
            "Dataset or set `precompute_ref_log_probs=False`."
        )
