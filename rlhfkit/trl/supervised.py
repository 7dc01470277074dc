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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from transformers import TrainingArguments

from .. import distributed
from ..agents.agent import model_name
from ..data.encode import Encoded, encode_pair
from ..data.preferences import load_preference_dataset
from ..data.sft import load_sft_dataset
from ..models import load_tokenizer
from ..trainers.dpo import DPOTrainer as NativeDPOTrainer
from ..trainers.sft import SFTTrainer as NativeSFTTrainer
from .arguments import as_steps, common, model_dtype, refuse_unsupported
from .data_forms import eval_label, eval_sets, is_iterable_dataset, stream_rows, trl_view
from .evaluation import TRLEvaluation
from .log_rows import TRLLogRows
from .output_dir import claim_output_dir
from .state import TRLTrainerMixin

NO_LIMIT = 10**7  # TRL's max_length=None (no truncation): rlhfkit's largest max_length
TAGS = {
    "SFT": "sft",
    "DPO": "dpo",
    "KTO": "kto",
    "Reward": "reward-trainer",
}  # TRL's model tags beside "trl" (_tag_names)


@dataclass
class SupervisedArguments(TrainingArguments):
    """The fields TRL 1.16's SFT, DPO and reward configs share (``trl/trainer/base_config.py`` and
    each config's own), with TRL's defaults; each config adds its fields and its ``HANDLED`` set."""

    logging_steps: float = 10
    gradient_checkpointing: bool = True
    bf16: bool | None = None  # type: ignore[assignment]  # TRL's None: True unless fp16 (base_config.py)
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


class SupervisedTRLTrainer(TRLLogRows, TRLEvaluation, TRLTrainerMixin):
    """TRL's trainer interface (``TRLTrainerMixin``) on a supervised trainer: optimizer steps are
    its steps; ``native`` turns TRL's arguments into the rlhfkit config and tokenizer. What TRL's
    trainers show besides: ``processing_class``; ``train_dataset`` / ``eval_dataset`` as TRL's
    prepared datasets (``data_forms.py``); ``evaluate`` and ``compute_metrics``
    (``evaluation.py``); ``state.log_history`` laid out as TRL's (``log_rows.py``); the model
    tagged with TRL's ``model_tags`` (``trl`` and the trainer's)."""

    trl_model = None  # the model TRL's trainer.model is, when it is not the rlhfkit trainer's own (reward.py)
    # the pair trainers' (DPO and reward model), read where the trainer is not the SFT one (KTO's drop-in
    # reads its own): their tokenised training pairs, and the reward model's tokenisation of rows
    train_pairs: list
    _encode_pairs: Callable[[list[dict], str], list]

    def native(self, model, args, train_dataset, eval_dataset, n_rows, optimizers, refused: dict):
        """``(rlhfkit config, None)``; ``refused``: TRL arguments by name, each refused unless None
        (``compute_metrics`` and ``preprocess_logits_for_metrics`` are taken). The datasets in
        TRL's forms (``data_forms.py``) are read here, before any model loads; the evaluation sets
        stay with the drop-in, which evaluates them as TRL does (``log_rows.py``)."""
        self.trl_compute_metrics = refused.pop("compute_metrics", None)
        self.trl_preprocess_logits = refused.pop("preprocess_logits_for_metrics", None)
        for name, value in refused.items():
            if value is not None:
                raise ValueError(f"{type(self).__name__}: {name}=... is not supported by rlhfkit")
        args = self.trl_config(model, args, optimizers)
        if train_dataset is None:  # TRL's message first
            raise ValueError(
                "`train_dataset` is required (a datasets.Dataset or IterableDataset, a list of dicts or a data "
                "file path)"
            )
        world, limit = distributed.planned_world(), None
        if is_iterable_dataset(train_dataset):  # a stream: the rows max_steps takes
            if args.max_steps <= 0:
                raise ValueError(
                    f"{type(self).__name__}: train_dataset is a datasets.IterableDataset, whose length is unknown: "
                    f"set max_steps in the {self.config_class.__name__} (TRL requires it too)"
                )
            limit = args.max_steps * args.rows_per_step(world)
        train = self.trl_source(train_dataset, "train_dataset", limit)
        evals = {
            n: self.trl_load(self.trl_source(d, eval_label(n)), eval_label(n))
            for n, d in eval_sets(eval_dataset).items()
        }
        if args.eval_strategy != "no" and not evals:  # transformers' check
            raise ValueError(
                f"You have set `args.eval_strategy` to {args.eval_strategy!s} but you didn't pass an `eval_dataset` "
                "to `Trainer`. Either set `args.eval_strategy` to `no` or pass an `eval_dataset`."
            )
        native = args.to_rlhfkit(n_rows(train), world)
        claim_output_dir(type(self).__name__, native.output_dir, native.resume_from)
        self._trl_inputs = train, evals
        return native, None

    def __init__(self, model, args, train_dataset=None, eval_dataset=None, **kwargs):
        """The rlhfkit trainer, built on the datasets ``native`` read (the arguments are the
        drop-in's own call), then TRL's evaluation sets tokenised and the model tagged."""
        train, evals = self._trl_inputs
        super().__init__(model, args, train, None, **kwargs)
        del self._trl_inputs  # the rows are tokenised now
        if self.trl_model is not None:
            self.model = self.trl_model
        self.trl_eval_sets = {n: self.trl_encode(rows, eval_label(n)) for n, rows in evals.items()}
        self.trl_rows, self._trl_window, self._trl_views = [], [], {}
        add_tags = getattr(self.model, "add_model_tags", None)
        if add_tags is not None:
            add_tags(["trl", TAGS[self.suffix]])

    # ---------------------------------------------------------------- TRL's attributes
    @property
    def processing_class(self):
        """TRL's ``trainer.processing_class``: the tokenizer."""
        return self.tokenizer

    @property
    def train_dataset(self):
        """TRL's prepared training set (``data_forms.trl_view``), built on first use."""
        if "train" not in self._trl_views:
            items = self.units if isinstance(self, NativeSFTTrainer) else self.train_pairs
            self._trl_views["train"] = trl_view(items, packed=bool(getattr(self.args, "packing", False)))
        return self._trl_views["train"]

    @property
    def eval_dataset(self):
        """TRL's prepared evaluation set(s): None, one dataset, or a dict of them by name."""
        if not self.trl_eval_sets:
            return None
        if "eval" not in self._trl_views:
            self._trl_views["eval"] = {n: trl_view(items) for n, items in self.trl_eval_sets.items()}
        views = self._trl_views["eval"]
        return views[None] if None in views else dict(views)

    # ---------------------------------------------------------------- each rlhfkit trainer's data
    def trl_source(self, dataset, name: str, limit: int | None = None):
        """``dataset`` as rlhfkit's loaders read it: a stream's rows (``data_forms.stream_rows``)."""
        return stream_rows(dataset, limit)

    def trl_load(self, dataset, name: str) -> list[dict]:
        """The rlhfkit trainer's loader: rows read and checked, before any model loads."""
        return (load_sft_dataset if isinstance(self, NativeSFTTrainer) else load_preference_dataset)(dataset, name)

    def trl_encode(self, rows: list[dict], name: str) -> list:
        """The rlhfkit trainer's tokenisation of loaded rows (each drop-in's TRL rules)."""
        if isinstance(self, NativeSFTTrainer):
            return self._encode_rows(rows, name)
        return (self._encode if isinstance(self, NativeDPOTrainer) else self._encode_pairs)(rows, name)

    def trl_prepare_eval(self, dataset, name: str) -> list:
        """A dataset given to ``evaluate`` read and tokenised as the trainer's own evaluation sets."""
        return self.trl_encode(self.trl_load(self.trl_source(dataset, name), name), name)

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
