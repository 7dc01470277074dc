"""TRL 1.16's ``SFTConfig`` and ``SFTTrainer`` on rlhfkit's SFT trainer.

The config is TRL's dataclass (``transformers.TrainingArguments`` plus TRL's fields, defaults and
checks); ``to_rlhfkit`` is the one table that maps it to rlhfkit's ``SFTConfig``, with the batch
arithmetic of ``supervised.py``. Which tokens are trained follows TRL's rules: the completion of
prompt/completion rows (``completion_only_loss``, None: True), every token of a ``messages`` row
unless ``assistant_only_loss`` (rlhfkit's own default is the assistant turns only), every token of
a ``dataset_text_field`` row, a tokenised row's ``labels`` or masks. So are the tokens themselves
(``SFTTrainer._encode_rows``, ``sft_data.py``): text rows, and chat rows without
``assistant_only_loss``, tokenised as TRL tokenises them, and ``max_length`` truncating as TRL's
``keep_start``; ``trainer.train_dataset`` / ``eval_dataset`` show TRL's prepared rows. TRL's dataset
forms and checks (``conversations``, ``skip_prepare_dataset``, ``padding_free``, a transform, a
plain ``TrainingArguments``) are TRL's; a Mixture-of-Experts model needs ``router_aux_loss_coef=0``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from transformers import TrainingArguments

from ..config.supervised import SFTConfig as NativeSFTConfig
from ..data.encode import Encoded, note_cut, note_unknown
from ..data.sft import encode_sft_rows, load_sft_dataset, training_units
from ..trainers.sft import SFTTrainer as NativeSFTTrainer
from .arguments import check_choice, from_training_arguments
from .callbacks import trl_callbacks
from .metrics import SFT_METRICS
from .sft_data import (
    check_prepared,
    check_transform,
    is_chat_row,
    is_text_row,
    keep_start,
    sft_view,
    trains,
    trl_chat_row,
    trl_rows,
    trl_text_row,
)
from .supervised import SupervisedArguments, SupervisedTRLTrainer


@dataclass
class SFTConfig(SupervisedArguments):
    """TRL 1.16's ``SFTConfig``: its fields, defaults and checks; ``to_rlhfkit`` gives the
    rlhfkit ``SFTConfig`` it runs as (docs: "Coming from TRL")."""

    learning_rate: float = 2e-5
    router_aux_loss_coef: float | None = None
    chat_template_path: str | None = None
    dataset_text_field: str = "text"
    dataset_kwargs: dict | str | None = None
    eos_token: str | None = None
    truncation_mode: str = "keep_start"
    shuffle_dataset: bool = False
    packing: bool = False
    packing_strategy: str = "bfd"
    padding_free: bool = False
    eval_packing: bool | None = None
    completion_only_loss: bool | None = None
    assistant_only_loss: bool = False
    loss_type: str = "nll"

    # TRL's fields to_rlhfkit translates or the trainer applies; padding_free and eval_packing change
    # no number (rlhfkit packs with position ids; its eval loss is exact unpacked). Any other: default only.
    HANDLED = SupervisedArguments.HANDLED | {
        "router_aux_loss_coef",
        "dataset_kwargs",
        "chat_template_path",
        "dataset_text_field",
        "eos_token",
        "packing",
        "packing_strategy",
        "padding_free",
        "eval_packing",
        "completion_only_loss",
        "assistant_only_loss",
        "loss_type",
    }

    def __post_init__(self):
        if self.loss_type == "chunked_nll":  # TRL's deprecated alias
            warnings.warn(
                "`loss_type='chunked_nll'` is deprecated and will be removed in v2.0.0. Use "
                "`loss_type='nll'` (the default), which computes the loss the same way, without "
                "materializing the full logits.",
                FutureWarning,
                stacklevel=3,
            )
            self.loss_type = "nll"
        super().__post_init__()
        check_choice(self, "loss_type", ("nll", "dft"))
        check_choice(self, "packing_strategy", ("bfd", "wrapped"))
        if self.packing and self.max_length is None:
            raise ValueError("When packing is enabled, `max_length` can't be `None`.")  # TRL's own check
        kwargs = self.dataset_kwargs
        if kwargs is not None and not (isinstance(kwargs, dict) and set(kwargs) <= {"skip_prepare_dataset"}):
            raise ValueError(
                f"SFTConfig field 'dataset_kwargs'={kwargs!r} is not supported by rlhfkit: only "
                "{'skip_prepare_dataset': True | False}"
            )

    @property
    def skip_prepare_dataset(self) -> bool:
        """TRL's ``dataset_kwargs={"skip_prepare_dataset": True}``: the rows are trainer-ready."""
        kwargs = self.dataset_kwargs if isinstance(self.dataset_kwargs, dict) else {}
        return bool(kwargs.get("skip_prepare_dataset", False))

    def to_rlhfkit(self, n_rows: int, world: int = 1) -> NativeSFTConfig:
        """The rlhfkit ``SFTConfig`` of this config for ``n_rows`` training rows on ``world``
        processes: without packing, TRL's number of optimizer steps (``max_steps``) for them."""
        if self.packing and self.max_steps <= 0 and (0 < self.warmup_steps < 1 or 0 < self.logging_steps < 1):
            raise ValueError(
                "SFTConfig: a ratio warmup_steps or logging_steps (< 1) with packing needs max_steps in "
                "rlhfkit: the number of packed rows is known only once the data are tokenised"
            )
        fields = self.supervised_fields(n_rows, world)
        if not self.packing:  # TRL's step count (its epochs end on a short step; rlhfkit's SFT rolls into the next)
            fields["max_steps"] = self.optimizer_steps(n_rows, world)
        fields.update(
            packing=self.packing,
            # TRL: None is True for prompt/completion rows; assistant masks also leave the prompt untrained
            completion_only_loss=self.completion_only_loss is not False or self.assistant_only_loss,
            assistant_only_loss=self.assistant_only_loss,
            loss_type=self.loss_type,
            packing_strategy="wrapped" if self.packing_strategy == "wrapped" else "next_fit",
        )
        return NativeSFTConfig(**fields)


class SFTTrainer(SupervisedTRLTrainer, NativeSFTTrainer):
    """TRL's ``SFTTrainer(model, args, data_collator, train_dataset, eval_dataset, processing_class,
    compute_loss_func, compute_metrics, callbacks, optimizers, optimizer_cls_and_kwargs,
    preprocess_logits_for_metrics, quantization_config, peft_config, formatting_func)`` on rlhfkit's
    SFT trainer. ``args``: an ``SFTConfig`` (default: TRL's, writing to ``<model name>-SFT``)."""

    config_class, suffix, loss_key = SFTConfig, "SFT", "sft/loss"
    trl_table = SFT_METRICS
    trl_eval_attr = "eval_examples"  # the rlhfkit trainer's tokenised evaluation set

    def __init__(
        self,
        model,
        args=None,
        data_collator=None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        compute_loss_func=None,
        compute_metrics=None,
        callbacks=None,
        optimizers=(None, None),
        optimizer_cls_and_kwargs=None,
        preprocess_logits_for_metrics=None,
        quantization_config=None,
        peft_config=None,
        formatting_func=None,
    ):
        refused = dict(
            data_collator=data_collator,
            compute_loss_func=compute_loss_func,
            compute_metrics=compute_metrics,
            optimizer_cls_and_kwargs=optimizer_cls_and_kwargs,
            preprocess_logits_for_metrics=preprocess_logits_for_metrics,
            quantization_config=quantization_config,
        )
        if isinstance(args, TrainingArguments) and not isinstance(args, SFTConfig):  # TRL converts it
            args = from_training_arguments(args, SFTConfig)
        args = self.trl_config(model, args, optimizers)
        self.trl_formatting_func = formatting_func
        if args.padding_free and not args.packing and args.max_length is not None:  # TRL's check
            raise ValueError(
                "When `padding_free=True` without packing, `max_length` is not enforced. Either enable packing "
                "(e.g., `packing=True, packing_strategy='bfd'`), provide already truncated inputs, or set "
                "`max_length=None`."
            )
        self.aux_loss_enabled = moe_aux_loss(model, args.router_aux_loss_coef)
        native, eval_dataset = self.native(
            model, args, train_dataset, eval_dataset, lambda rows: len(load_sft_dataset(rows)), optimizers, refused
        )
        tokenizer = self.trl_tokenizer(model, processing_class, args.eos_token, args.pad_token, args.chat_template_path)
        super().__init__(
            model,
            native,
            train_dataset,
            eval_dataset,
            processing_class=tokenizer,
            peft_config=peft_config,
            callbacks=trl_callbacks(callbacks, self),
        )

    @property
    def train_dataset(self):
        """TRL's prepared training set (``sft_data.sft_view``): the training units, with
        ``seq_lengths`` when packed example by example (TRL's bfd; its wrapped rows have none)."""
        if "train" not in self._trl_views:
            a = self.args
            self._trl_views["train"] = sft_view(self.units, a.packing and a.packing_strategy != "wrapped")
        return self._trl_views["train"]

    @property
    def eval_dataset(self):
        """TRL's prepared evaluation set(s), packed as TRL packs them with ``eval_packing`` (None: as
        ``packing``); rlhfkit evaluates each example whole, with the same loss."""
        if not self.trl_eval_sets:
            return None
        if "eval" not in self._trl_views:
            a, packed = self.args, self.args.packing and self.trl_args.eval_packing is not False
            self._trl_views["eval"] = {
                n: sft_view(
                    training_units(items, packed, a.packing_strategy, a.max_length),
                    packed and a.packing_strategy != "wrapped",
                )
                for n, items in self.trl_eval_sets.items()
            }
        views = self._trl_views["eval"]
        return views[None] if None in views else dict(views)

    def trl_source(self, dataset, name: str, limit: int | None = None):
        """The dataset's rows in the forms rlhfkit's loader reads (``sft_data.trl_rows``: a
        ``formatting_func``, ``dataset_text_field``, ``conversations``), for training, evaluation
        and ``evaluate(eval_dataset=...)`` alike."""
        a = self.trl_args
        check_transform(dataset, a.skip_prepare_dataset)
        return trl_rows(super().trl_source(dataset, name, limit), a.dataset_text_field, self.trl_formatting_func, name)

    def _encode_rows(self, rows: list[dict], name: str) -> list[Encoded]:
        """TRL's tokens and truncation, not rlhfkit's. Text rows and text prompt-completion rows are
        tokenised as TRL tokenises them (``trl_encode``: the tokenizer's special tokens, no second
        EOS); a dataset with chat rows as rlhfkit renders it. Truncation is
        ``truncation_mode="keep_start"`` (rlhfkit's own cuts a long prompt's start first): each
        example keeps its first ``max_length`` tokens, so a long completion loses its end and its
        EOS, and without packing an example left with no trained token (its prompt fills
        ``max_length``) is dropped, as TRL drops it."""
        a, tok = self.args, self.tokenizer
        limit = a.max_length
        if self.trl_args.skip_prepare_dataset:  # trainer-ready rows: neither truncated nor filtered
            check_prepared(rows, "train" if name == "train_dataset" else "eval")
            return encode_sft_rows(rows, tok, None, name)
        if all(is_text_row(row) for row in rows):
            whole = [trl_text_row(row, tok, a.completion_only_loss) for row in rows]
            note_unknown(name, [e.input_ids for e in whole], tok)
        elif not a.assistant_only_loss and all(is_chat_row(row) for row in rows):
            whole = [_row(trl_chat_row, i, name, row, tok, a.completion_only_loss) for i, row in enumerate(rows)]
        else:
            templated = next((i for i, row in enumerate(rows) if row.get("chat_template_kwargs")), None)
            if templated is not None:
                raise ValueError(
                    f"{name}: row index {templated} (0-based): chat_template_kwargs with assistant_only_loss=True "
                    "is not supported by rlhfkit (its assistant turns are found without them)"
                )  # TRL's completion_only_loss=None applies a tokenised row's completion_mask to none
            tokenised = "input_ids" in rows[0] and self.trl_args.completion_only_loss is None
            whole = encode_sft_rows(
                rows,
                tok,
                None,
                name,
                completion_only=a.completion_only_loss and not tokenised,
                assistant_only=a.assistant_only_loss,
                end_ids=self.end_ids,
            )
        if a.packing and a.packing_strategy == "wrapped" and name == "train_dataset":
            return whole  # TRL's wrapped packing cuts the examples into rows whole: nothing truncated
        out = [keep_start(e, limit) for e in whole]
        note_cut(name, sum(e.cut for e in out), len(out), "rows", limit, "their end, TRL's keep_start")
        if a.packing:  # TRL's packing truncates and drops nothing
            return out
        kept = [e for e in out if trains(e)]
        if not kept:
            raise ValueError(
                f"{name}: every row's prompt fills max_length={limit} tokens, leaving nothing to train "
                "(TRL drops such rows); raise max_length"
            )
        if len(kept) < len(out):
            warnings.warn(
                f"{name}: dropped {len(out) - len(kept)} of {len(out)} rows whose prompt fills "
                f"max_length={limit} tokens (nothing left to train), as TRL does",
                stacklevel=2,
            )
        return kept


def _row(encode, i: int, name: str, row: dict, *args) -> Encoded:
    """``encode(row, *args)``, its error naming the row."""
    try:
        return encode(row, *args)
    except ValueError as e:  # e.g. chat messages and a tokenizer without a chat template
        raise ValueError(f"{name}: row index {i} (0-based): {e}") from None


def moe_aux_loss(model, coef: float | None) -> bool:
    """TRL's ``aux_loss_enabled`` for ``model`` (a path or a model object): a Mixture-of-Experts model
    (its config has ``output_router_logits``) whose router load-balancing loss TRL adds,
    ``router_aux_loss_coef`` (None: the model config's) times it. rlhfkit adds none: such a model is
    refused unless ``router_aux_loss_coef=0.0``, so False; a coefficient for a model without a router
    is TRL's error. A model whose config cannot be read before it loads is not checked."""
    config = getattr(model, "config", None)
    if config is None:
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(str(model))
        except (OSError, ValueError, KeyError):
            return False
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    moe = hasattr(text, "output_router_logits")
    name = type(model).__name__ if hasattr(model, "config") else (getattr(config, "architectures", None) or ["it"])[0]
    if coef and not moe:  # TRL's message
        raise ValueError(
            f"`router_aux_loss_coef` is set to {coef} but {name} is not a Mixture-of-Experts model that returns "
            "its router logits, so there is no auxiliary loss to weight."
        )
    coef = getattr(text, "router_aux_loss_coef", 0.0) if coef is None else coef
    if moe and coef:
        raise ValueError(
            f"SFTConfig field 'router_aux_loss_coef'={coef!r} is not supported by rlhfkit: the model is a "
            "Mixture-of-Experts model whose router load-balancing loss TRL adds by default, and rlhfkit does not; "
            "set router_aux_loss_coef=0.0 to train without it"
        )
    return False
