"""What the drop-in SFT, DPO and reward configs and trainers share: TRL's base-config defaults,
the batch arithmetic and step count, and TRL's trainer interface on rlhfkit's supervised trainers.

The batch arithmetic is ``transformers.Trainer``'s, which TRL's SFT, DPO and reward trainers keep:
``per_device_train_batch_size`` rows (examples, packed rows or preference pairs) per process per
micro-step, ``gradient_accumulation_steps`` micro-steps per optimizer step, so
``per_device x processes x accumulation`` rows per optimizer step, with the loss of one batch that
large (SFT: the mean over every trained token of the step, TRL's ``num_items_in_batch``; DPO and
the reward model: the mean over the step's pairs). rlhfkit's supervised configs count the rows of
a micro-step over every process: ``batch_size = per_device x processes``, ``grad_accumulation =
gradient_accumulation_steps`` (each process still takes ``per_device`` rows per forward pass).
``max_steps`` counts optimizer steps in both; without it, ``num_train_epochs`` passes.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path

from transformers import TrainingArguments

from .. import distributed
from ..agents.agent import model_name
from ..data.encode import Encoded, encode_pair
from ..models import load_tokenizer
from .arguments import as_steps, common, model_dtype, refuse_unsupported
from .output_dir import claim_output_dir
from .state import TRLTrainerMixin

NO_LIMIT = 10**7  # TRL's max_length=None (no truncation): rlhfkit's largest max_length


@dataclass
class SupervisedArguments(TrainingArguments):
    """The fields TRL 1.16's SFT, DPO and reward configs share (``trl/trainer/base_config.py`` and
    each config's own), with TRL's defaults; each config adds its fields and its ``HANDLED`` set."""

    logging_steps: float = 10
    gradient_checkpointing: bool = True
    bf16: bool | None = None
    model_init_kwargs: dict | str | None = None
    trust_remote_code: bool = False
    dataset_num_proc: int | None = None
    max_length: int | None = 1024
    pad_to_multiple_of: int | str | None = "auto"
    activation_offloading: bool = False
    pad_token: str | None = None

    # Translated (with TRANSLATED of arguments.py) by supervised_fields; the rest: refused off their default.
    # activation_checkpointing: transformers' new name of gradient_checkpointing, which mirrors it.
    HANDLED = frozenset(
        {
            "bf16",
            "logging_steps",
            "gradient_checkpointing",
            "activation_checkpointing",
            "learning_rate",
            "model_init_kwargs",
            "max_length",
            "pad_token",
        }
    )

    def __post_init__(self):
        refuse_unsupported(self, self.HANDLED)
        self.bf16 = not self.fp16 if self.bf16 is None else self.bf16  # TRL's base_config rule
        if self.pad_token is not None:  # TRL's own deprecation
            warnings.warn(
                "`pad_token` is deprecated and will be removed in v2.0.0. Set `tokenizer.pad_token` "
                "directly and pass it as `processing_class` to the trainer instead.",
                FutureWarning,
                stacklevel=3,
            )
        with warnings.catch_warnings():  # TRL's own default: transformers 5 calls the field deprecated
            warnings.filterwarnings("ignore", message="`gradient_checkpointing` is deprecated", category=FutureWarning)
            super().__post_init__()
        if isinstance(self.pad_to_multiple_of, str) and self.pad_to_multiple_of != "auto":  # TRL's CLI rule
            self.pad_to_multiple_of = (
                None if self.pad_to_multiple_of.lower() in ("none", "null") else int(self.pad_to_multiple_of)
            )
        if self.pad_to_multiple_of == "auto":
            self.pad_to_multiple_of = None  # padding changes no number rlhfkit computes

    def rows_per_step(self, world: int) -> int:
        """Rows of one optimizer step over every process."""
        return self.per_device_train_batch_size * world * self.gradient_accumulation_steps

    def optimizer_steps(self, n_rows: int, world: int) -> int:
        """TRL's step count: ``max_steps``, or ``num_train_epochs`` passes over ``n_rows`` rows."""
        if self.max_steps > 0:
            return self.max_steps
        return max(1, math.ceil(self.num_train_epochs * math.ceil(n_rows / self.rows_per_step(world))))

    def supervised_fields(self, n_rows: int, world: int) -> dict:
        """The fields of rlhfkit's supervised configs every drop-in translates alike (the module
        docstring has the batch arithmetic); ``n_rows`` turns a ratio (``warmup_steps`` or
        ``logging_steps`` below 1) into steps, as TRL does with its step count."""
        steps = self.optimizer_steps(n_rows, world)
        fields = common(self, steps)
        fields.update(
            batch_size=self.per_device_train_batch_size * world,
            grad_accumulation=self.gradient_accumulation_steps,
            max_steps=self.max_steps if self.max_steps > 0 else None,
            num_epochs=self.num_train_epochs,
            max_length=NO_LIMIT if self.max_length is None else self.max_length,
            dtype=model_dtype(self),
            log_every=as_steps(self.logging_steps, steps),
            save_steps=as_steps(self.save_steps, steps) if self.save_strategy != "no" else 0,
            save_total_limit=self.save_total_limit,
            eval_every=as_steps(self.eval_steps or self.logging_steps, steps) if self.eval_strategy != "no" else 0,
            overwrite=True,
        )  # TRL writes into an existing output_dir: output_dir.py replaces rlhfkit's files only
        return fields


def trl_encode(prompt, completion, tokenizer) -> Encoded:
    """``prompt`` + ``completion`` + EOS tokenised as TRL 1.16's SFT, DPO and reward trainers do,
    not as rlhfkit's ``encode_pair``. Text prompt and completion: ``prompt`` and ``prompt +
    completion + EOS`` are each tokenised as one text with the tokenizer's own special tokens (a
    Llama's BOS; rlhfkit adds none and tokenises the two parts apart), the EOS string appended only
    where the completion does not end with it, and the completion starts where the two token lists
    diverge (TRL's ``common_prefix_length``). Chat messages: rlhfkit's rendering (``encode_pair``)."""
    if not (isinstance(prompt, str) and isinstance(completion, str)):
        return encode_pair(prompt, completion, tokenizer)
    eos = tokenizer.eos_token
    prompt_ids = tokenizer(prompt)["input_ids"]
    ids = tokenizer(prompt + completion + ("" if completion.endswith(eos) else eos))["input_ids"]
    n = 0
    while n < min(len(prompt_ids), len(ids)) and prompt_ids[n] == ids[n]:
        n += 1
    return Encoded(ids, n, False, False)


class SupervisedTRLTrainer(TRLTrainerMixin):
    """TRL's trainer interface (``TRLTrainerMixin``) on a supervised trainer: optimizer steps are
    its steps; ``native`` turns TRL's arguments into the rlhfkit config and tokenizer."""

    def native(self, model, args, train_dataset, eval_dataset, n_rows, optimizers, refused: dict):
        """``(rlhfkit config, eval_dataset or None)``; ``refused``: TRL arguments rlhfkit has no
        counterpart for, by name (each must be None)."""
        for name, value in refused.items():
            if value is not None:
                raise ValueError(f"{type(self).__name__}: {name}=... is not supported by rlhfkit")
        args = self.trl_config(model, args, optimizers)
        if train_dataset is None:
            raise ValueError("train_dataset is required (a datasets.Dataset, a list of dicts or a data file path)")
        if isinstance(eval_dataset, dict):
            raise ValueError(
                f"{type(self).__name__}: eval_dataset as a dict of datasets is not supported by rlhfkit: "
                "pass one dataset"
            )
        native = args.to_rlhfkit(n_rows(train_dataset), distributed.planned_world())
        claim_output_dir(type(self).__name__, native.output_dir, native.resume_from)
        return native, eval_dataset if args.eval_strategy != "no" else None

    @staticmethod
    def trl_tokenizer(model, processing_class, eos_token=None, pad_token=None, chat_template_path=None):
        """``processing_class``, or the model's tokenizer (from the model's own name when the model
        is an object), with TRL's ``eos_token`` / ``pad_token`` / ``chat_template_path`` (a Jinja
        file) set on it; ``processing_class`` as given when none is set and the model is a path."""
        is_path = isinstance(model, (str, Path))
        if processing_class is None and is_path and not (eos_token or pad_token or chat_template_path):
            return None  # the rlhfkit trainer loads it
        tok = (
            processing_class
            if processing_class is not None
            else load_tokenizer(str(model) if is_path else model_name(model), "model")
        )
        for name, token in (("eos_token", eos_token), ("pad_token", pad_token)):
            if token is not None:
                if token not in tok.get_vocab():
                    raise ValueError(
                        f"The specified `{name}` ({token!r}) is not found in the vocabulary of the given "
                        f"`processing_class` ({type(tok).__name__})."
                    )
                setattr(tok, name, token)
        if chat_template_path is not None:
            path = Path(chat_template_path)
            if not (path.is_file() and path.suffix in (".jinja", ".j2")):
                raise ValueError(
                    f"chat_template_path={chat_template_path!r} is not supported by rlhfkit: only a "
                    ".jinja or .j2 file (cloning another tokenizer's template is not)"
                )
            tok.chat_template = path.read_text(encoding="utf-8")
        return tok

    @staticmethod
    def trl_kept_pairs(pairs: list, dropped: int, total: int, name: str, limit: int, why: str) -> list:
        """``pairs`` after TRL's length filter dropped ``dropped`` of ``total`` (``why``: which pairs,
        before "max_length"): none left is an error, some dropped a warning."""
        if not pairs:
            raise ValueError(
                f"{name}: TRL drops pairs {why} max_length={limit} tokens, and that is every pair; raise max_length"
            )
        if dropped:
            warnings.warn(
                f"{name}: dropped {dropped} of {total} pairs {why} max_length={limit} tokens, as TRL does", stacklevel=3
            )
        return pairs

    trl_table: dict = {}  # TRL's metric name -> rlhfkit's (metrics.py), each trainer's own

    def trl_metrics(self) -> dict:
        return self.trl_table

    def optimizer_steps_per_row(self) -> int:
        return 1

    def optimizer_steps_done(self) -> int:
        return self.step

    def optimizer_steps_total(self) -> int:
        return self.total_steps
