"""TRL's evaluation API on the supervised drop-ins (SFT, DPO, reward): ``trainer.evaluate(eval_dataset=None,
ignore_keys=None, metric_key_prefix="eval")`` and ``compute_metrics``, as ``transformers.Trainer``
(which TRL's trainers extend) has them.

``evaluate`` takes what TRL's does: nothing (the trainer's ``eval_dataset``), the name of one of
its evaluation sets, or a new dataset in any form the trainer takes (``data_forms.py``), a dict of
them included. Each set is scored by the rlhfkit trainer's own evaluation (the loss and metrics
its training logs) and returns, and logs to ``state.log_history``, TRL's keys:
``<prefix>_loss`` and the trainer's metrics (``metrics.py``'s ``eval_*`` names), ``compute_metrics``'
results, ``<prefix>_runtime``, ``<prefix>_samples_per_second`` and ``<prefix>_steps_per_second``
(per ``per_device_eval_batch_size`` rows); ``<prefix>`` is ``metric_key_prefix``, with
``_<name>`` for a named set (``eval_data1_loss``).

``compute_metrics(EvalPrediction)`` gets what TRL's Trainer passes it, batch by batch of
``per_device_eval_batch_size`` rows (concatenated, shorter batches padded with -100, as
``transformers.trainer_pt_utils.nested_concat`` does), each through ``preprocess_logits_for_metrics``
first when given: for SFT the model's logits and the labels (-100 where no token is trained); for
DPO the logits of each batch's chosen rows then its rejected rows, and their ``input_ids`` as
labels; for the reward model (``reward.py``) each batch's chosen scores then its rejected scores
(shape ``(2 x rows, 1)``) and no labels. With ``batch_eval_metrics`` it is called per batch with
``compute_result`` True on the last, whose result counts.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..data.padding import pad
from .data_forms import eval_label, eval_sets, trained_mask

if TYPE_CHECKING:
    from ..trainers.supervised import SupervisedTrainer
    from .state import TRLTrainerMixin

    class _Trainer(TRLTrainerMixin, SupervisedTrainer):
        """The classes the mixin comes before in the supervised drop-ins (``supervised.py``):
        ``TRLTrainerMixin``, then the rlhfkit trainer (SFT, DPO, KTO or reward model) with what they all
        have beyond ``SupervisedTrainer``, as the type checker reads it; at run time its base is object."""

        model: Any  # the trained model (a peft model with LoRA)
        tokenizer: Any

        def __init__(self, model, args, train_dataset, eval_dataset, **kwargs) -> None: ...
        def evaluate(self) -> dict[str, float]: ...

else:
    _Trainer = object


class TRLEvaluation(_Trainer):
    """Mixed into ``SupervisedTRLTrainer`` before ``TRLTrainerMixin``; the trainer provides
    ``trl_eval_sets`` (name -> tokenised items), ``trl_prepare_eval``, ``trl_eval_attr`` and
    ``trl_rows`` (``supervised.py``)."""

    trl_compute_metrics: Callable | None = None
    trl_preprocess_logits: Callable | None = None
    trl_eval_sets: dict
    trl_rows: list
    trl_epoch: float | None = None  # the epoch of the last logged step (None before training)
    trl_prepare_eval: Callable[[Any, str], list]  # a dataset given to evaluate, tokenised (supervised.py)
    trl_eval_attr: str  # the rlhfkit trainer's attribute holding its tokenised evaluation set (each drop-in's)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict:
        """TRL's ``evaluate`` (the module docstring); ``ignore_keys`` names outputs rlhfkit never returns."""
        sets: dict[str | None, list]
        if isinstance(eval_dataset, str):
            if eval_dataset not in self.trl_eval_sets:
                names = ", ".join(repr(n) for n in self.trl_eval_sets if n is not None) or "none"
                raise ValueError(
                    f"evaluate(eval_dataset={eval_dataset!r}): no evaluation set of that name (named: {names})"
                )
            sets = {None: self.trl_eval_sets[eval_dataset]}
        elif eval_dataset is None:
            if not self.trl_eval_sets:
                raise ValueError("Trainer: evaluation requires an eval_dataset.")  # transformers' message
            sets = self.trl_eval_sets
        else:
            sets = {
                name: self.trl_prepare_eval(data, eval_label(name)) for name, data in eval_sets(eval_dataset).items()
            }
        metrics = {}
        for name, items in sets.items():
            prefix = metric_key_prefix if name is None else f"{metric_key_prefix}_{name}"
            out = self.trl_evaluate_set(items, prefix)[0]
            if self.trl_epoch is not None:
                out["epoch"] = self.trl_epoch
            self.trl_rows.append({**out, "step": self.optimizer_steps_done()})
            metrics.update(out)
        return metrics

    def trl_evaluate_set(self, items: list, prefix: str) -> tuple[dict, dict]:
        """``(TRL's metrics, rlhfkit's)`` of one tokenised evaluation set: the rlhfkit trainer's
        evaluation (its ``eval/*`` metrics) run on ``items``, plus ``compute_metrics``' and the timing."""
        start = time.perf_counter()
        with self._trl_eval_items(items):
            native = super().evaluate()  # the rlhfkit trainer's own
        native = native if isinstance(native, dict) else {"eval/loss": float(native)}
        table = self.trl_metrics()
        out = {prefix + k[4:]: native[v] for k, v in table.items() if k.startswith("eval_") and v in native}
        if self.trl_compute_metrics is not None:
            computed = self._trl_metrics(items, self.trl_compute_metrics)
            out.update({k if k.startswith(f"{prefix}_") else f"{prefix}_{k}": v for k, v in computed.items()})
        runtime = max(time.perf_counter() - start, 1e-9)
        batches = math.ceil(len(items) / self.trl_args.per_device_eval_batch_size)
        out[f"{prefix}_runtime"] = round(runtime, 4)
        out[f"{prefix}_samples_per_second"] = round(len(items) / runtime, 3)
        out[f"{prefix}_steps_per_second"] = round(batches / runtime, 3)
        return out, native

    @contextmanager
    def _trl_eval_items(self, items: list):
        """The rlhfkit trainer's evaluation set is ``items`` for the duration."""
        attr = self.trl_eval_attr
        saved = getattr(self, attr)
        setattr(self, attr, items)
        try:
            yield
        finally:
            setattr(self, attr, saved)

    # ---------------------------------------------------------------- compute_metrics
    def _trl_metrics(self, items: list, compute_metrics: Callable) -> dict:
        from transformers import EvalPrediction
        from transformers.trainer_utils import denumpify_detensorize

        # EvalPrediction's label_ids: None where the trainer has no labels (the reward model); transformers
        # annotates it without None, which the class stores as given (the ignores below)
        batches = list(self.trl_prediction_batches(items))
        if self.trl_args.batch_eval_metrics:
            result = {}
            for k, (preds, labels) in enumerate(batches):
                last = k == len(batches) - 1
                result = compute_metrics(EvalPrediction(preds, labels), compute_result=last)  # type: ignore[arg-type]
        else:
            label_arrays = [b[1] for b in batches if b[1] is not None]  # every batch's or none (the trainer's batches)
            label_ids = concat_padded(label_arrays) if label_arrays else None
            result = compute_metrics(
                EvalPrediction(predictions=concat_padded([b[0] for b in batches]), label_ids=label_ids)  # type: ignore[arg-type]
            )
        return denumpify_detensorize(dict(result or {}))

    def trl_prediction_batches(self, items: list) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        """``(logits, labels)`` per evaluation batch of a causal LM (SFT examples, DPO pairs: the
        module docstring), after ``preprocess_logits_for_metrics``. Every process runs every batch."""
        model, size = self.model, self.trl_args.per_device_eval_batch_size
        pad_id = self.tokenizer.pad_token_id
        was_training = model.training
        model.eval()
        try:
            for i in range(0, len(items), size):
                ids, labels = _rows_and_labels(items[i : i + size])
                input_ids, mask = pad(ids, pad_id, device=self.device)
                label_ids = pad(labels, -100, device=self.device)[0]
                with torch.no_grad(), self._autocast():
                    logits = model(input_ids=input_ids, attention_mask=mask, use_cache=False).logits.float()
                yield self._trl_preprocessed(logits, label_ids)
        finally:
            model.train(was_training)

    def _trl_preprocessed(self, logits: torch.Tensor, labels: torch.Tensor | None):
        if self.trl_preprocess_logits is not None:
            logits = self.trl_preprocess_logits(logits, labels)
        as_array = lambda t: t.detach().float().cpu().numpy() if isinstance(t, torch.Tensor) else t  # noqa: E731
        return as_array(logits), None if labels is None else as_array(labels)


def _rows_and_labels(batch: list) -> tuple[list[list[int]], list[list[int]]]:
    """The token rows of one evaluation batch and their labels, as TRL's collators make them."""
    from ..trainers.dpo import PreferencePair

    if batch and isinstance(batch[0], PreferencePair):
        rows = [p.prompt + p.chosen for p in batch] + [p.prompt + p.rejected for p in batch]
        return rows, rows  # TRL's DPO passes the input ids as the labels
    rows = [list(e.input_ids) for e in batch]
    labels = [[t if m else -100 for t, m in zip(e.input_ids, trained_mask(e), strict=True)] for e in batch]
    return rows, labels


def concat_padded(arrays: list[np.ndarray], padding_index: int = -100) -> np.ndarray:
    """The batches' arrays concatenated on the first axis, the second padded with ``padding_index``
    to the longest (``transformers.trainer_pt_utils.nested_concat``)."""
    arrays = [np.asarray(a) for a in arrays]
    if arrays[0].ndim < 2 or all(a.shape[1:] == arrays[0].shape[1:] for a in arrays):
        return np.concatenate(arrays, axis=0)
    width = max(a.shape[1] for a in arrays)
    out = np.full((sum(a.shape[0] for a in arrays), width, *arrays[0].shape[2:]), padding_index, dtype=arrays[0].dtype)
    row = 0
    for a in arrays:
        out[row : row + a.shape[0], : a.shape[1]] = a
        row += a.shape[0]
    return out
