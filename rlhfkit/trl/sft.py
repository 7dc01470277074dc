"""TRL 1.16's ``SFTConfig`` and ``SFTTrainer`` on rlhfkit's SFT trainer.

The config is TRL's dataclass (``transformers.TrainingArguments`` plus TRL's fields, defaults and
checks); ``to_rlhfkit`` is the one table that maps it to rlhfkit's ``SFTConfig``, with the batch
arithmetic of ``supervised.py``. Which tokens are trained follows TRL's rules: the completion of
prompt/completion rows (``completion_only_loss``, None: True), every token of a ``messages`` row
unless ``assistant_only_loss`` (rlhfkit's own default is the assistant turns only), every token of
a ``dataset_text_field`` row. So are the tokens themselves (``SFTTrainer._encode_rows``): text rows
tokenised as TRL tokenises them, and ``max_length`` truncating as TRL's ``keep_start``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

from ..config.supervised import SFTConfig as NativeSFTConfig
from ..data.encode import Encoded, note_cut, note_unknown
from ..data.prompts import labelled_rows
from ..data.sft import encode_sft_rows, load_sft_dataset
from ..data.sft_turns import TurnsEncoded
from ..trainers.sft import SFTTrainer as NativeSFTTrainer
from .arguments import check_choice
from .callbacks import trl_callbacks
from .metrics import SFT_METRICS
from .supervised import SupervisedArguments, SupervisedTRLTrainer, trl_encode


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
        check_choice(self, "packing_strategy", ("bfd",))
        if self.packing and self.max_length is None:
            raise ValueError("When packing is enabled, `max_length` can't be `None`.")  # TRL's own check

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
        )
        return NativeSFTConfig(**fields)


class SFTTrainer(SupervisedTRLTrainer, NativeSFTTrainer):
    """TRL's ``SFTTrainer(model, args, data_collator, train_dataset, eval_dataset, processing_class,
    compute_loss_func, compute_metrics, callbacks, optimizers, optimizer_cls_and_kwargs,
    preprocess_logits_for_metrics, quantization_config, peft_config, formatting_func)`` on rlhfkit's
    SFT trainer. ``args``: an ``SFTConfig`` (default: TRL's, writing to ``<model name>-SFT``)."""

    config_class, suffix, loss_key = SFTConfig, "SFT", "sft/loss"
    trl_table = SFT_METRICS

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
        args = self.trl_config(model, args, optimizers)
        field = args.dataset_text_field
        train_dataset, eval_dataset = (
            _as_text_rows(d, field, formatting_func, name) if d is not None else None
            for d, name in ((train_dataset, "train_dataset"), (eval_dataset, "eval_dataset"))
        )
        native, eval_dataset = self.native(
            model, args, train_dataset, eval_dataset, lambda d: len(load_sft_dataset(d)), optimizers, refused
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
        if all(_is_text_row(row) for row in rows):
            whole = [_trl_text_row(row, tok, a.completion_only_loss) for row in rows]
            note_unknown(name, [e.input_ids for e in whole], tok)
        else:  # TRL's completion_only_loss=None applies a tokenised row's completion_mask to none
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
        out = [_keep_start(e, limit) for e in whole]
        note_cut(name, sum(e.cut for e in out), len(out), "rows", limit, "their end, TRL's keep_start")
        if a.packing:  # TRL's packing truncates and drops nothing
            return out
        kept = [e for e in out if _trains(e)]
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


def _is_text_row(row: dict) -> bool:
    """A ``{"text"}`` row, or a prompt-completion row of two texts (no chat messages, no tokens)."""
    if "messages" in row or "input_ids" in row:
        return False
    return "prompt" not in row or isinstance(row["prompt"], str) and isinstance(row["completion"], str)


def _trl_text_row(row: dict, tokenizer, completion_only: bool) -> Encoded:
    """A text row as TRL tokenises it: every token trained, or for a prompt-completion row only
    the completion's (``completion_only``)."""
    if "prompt" in row:
        e = trl_encode(row["prompt"], row["completion"], tokenizer)
        return e if completion_only else replace(e, prompt_len=0)
    return replace(trl_encode("", row["text"], tokenizer), prompt_len=0)


def _keep_start(e: Encoded, limit: int) -> Encoded:
    """``e``'s first ``limit`` tokens (TRL's ``keep_start``)."""
    if len(e.input_ids) <= limit:
        return e
    cut = dict(input_ids=e.input_ids[:limit], prompt_len=min(e.prompt_len, limit), truncated=True, cut=True)
    return replace(e, **cut, mask=e.mask[:limit]) if isinstance(e, TurnsEncoded) else replace(e, **cut)


def _trains(e: Encoded) -> bool:
    """Whether ``e`` has a trained token (TRL's test: a label that is not -100)."""
    return any(e.mask) if isinstance(e, TurnsEncoded) else e.prompt_len < len(e.input_ids)


def _as_text_rows(dataset, field: str, formatting_func, name: str):
    """TRL's language-modeling rows as rlhfkit's ``{"text"}`` rows: ``formatting_func(row)`` of
    every row, or the ``field`` column of rows without a prompt or messages when it is not 'text'.
    Any other dataset as it is (rlhfkit reads it)."""
    if formatting_func is None and field == "text":
        return dataset
    rows = [row for _, row in labelled_rows(dataset, name)[1]]
    if formatting_func is not None:
        return [{"text": formatting_func(row)} for row in rows]
    return [
        {"text": row[field]} if field in row and not {"prompt", "completion", "messages"} & set(row) else row
        for row in rows
    ]
