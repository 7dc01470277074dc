"""TRL's evaluation on the GRPO / RLOO drop-ins: ``trainer.evaluate(eval_dataset=None, ignore_keys=None,
metric_key_prefix="eval")`` and the evaluations a run makes (``eval_strategy="steps"`` every ``eval_steps``
optimizer steps, ``eval_on_start``), as TRL 1.16's ``GRPOTrainer`` / ``RLOOTrainer`` evaluate
(``trl/trainer/grpo_trainer.py``: ``prediction_step`` -> ``compute_loss`` on a generated batch).

Each evaluation batch holds ``per_device_eval_batch_size`` completions per process:
``num_generations_eval`` (default ``num_generations``) of each of its prompts, sampled with the
training sampling settings by the current policy, scored by the training reward sources, their
advantages computed within each prompt's group, and the training loss evaluated on them without a
gradient (at the sampling policy the ratio is 1: the loss is ``-A`` aggregated as ``loss_type`` says,
plus ``beta`` x KL, minus the entropy bonus; ``rl.update.loss``); with ``num_generations_eval=1`` a
completion has no baseline and its advantage is 0 (TRL's RLOO; TRL's GRPO divides 0 by a NaN std).
``<prefix>_loss`` is the mean of the batches' losses, the other metrics their means: ``<prefix>_reward``,
``_reward_std``, ``_rewards/<function>/mean`` and ``/std``, ``_completions/mean_length``, ``/max_length``,
``/clipped_ratio``, ``_entropy`` (``_kl`` with ``beta > 0``), ``_runtime``, ``_samples_per_second``
(completions), ``_steps_per_second`` (batches). ``<prefix>`` is ``metric_key_prefix``, with
``_<name>`` for a set of a dict of datasets (``eval_data1_loss``). The evaluated set is any dataset
form the trainer takes (``rl_inputs.py``), a stream read to its end.

rlhfkit's run row (``metrics.jsonl``) gets the same numbers as ``eval/loss``, ``eval/score_mean``,
``eval/<function>_mean``, ... (``eval/<name>/...`` for a named set).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from .. import distributed
from ..config import part
from ..data import load_prompt_dataset
from ..data.encode import tokenize_prompts
from ..rl import advantages, experience, update
from ..rl.build import agent_prompt_limit
from .rl_inputs import eval_sets, prompt_rows

if TYPE_CHECKING:
    from ..trainers.rl import RLTrainer
    from .state import TRLTrainerMixin

    class _Trainer(TRLTrainerMixin, RLTrainer):
        """The classes the mixin comes before in the drop-in trainers (``rl_trainers.py``), as the
        type checker reads it; at run time its base is object."""

else:
    _Trainer = object

# TRL's evaluation name -> rlhfkit's run-row name under eval/ (the reward functions' are added per run)
EVAL_NAMES = {
    "loss": "loss",
    "reward": "score_mean",
    "reward_std": "score_std",
    "completions/mean_length": "response_length_mean",
    "completions/max_length": "response_length_max",
    "completions/clipped_ratio": "truncated_frac",
    "entropy": "entropy",
    "kl": "kl",
}
# rlhfkit's name of each, from an evaluation batch's metrics (update.loss and the batch's)
SOURCES = {
    "loss": "policy/total_loss",
    "score_mean": "reward/mean",
    "score_std": "reward/std",
    "response_length_mean": "rollout/response_length_mean",
    "response_length_max": "rollout/response_length_max",
    "truncated_frac": "rollout/truncated_frac",
    "entropy": "policy/entropy",
    "kl": "kl/k3",
}


class TRLRLEvaluation(_Trainer):
    """Mixed into the GRPO / RLOO drop-ins before ``TRLTrainerMixin`` (the module docstring);
    ``trl_eval_data`` holds the trainer's evaluation sets, ``trl_rows`` TRL's log rows."""

    trl_eval_data: dict
    trl_rows: list
    trl_epoch_entry: Callable[[], dict]  # TRLRLRows' (rl_rows.py)

    def trl_prepare_eval(self, eval_dataset) -> dict:
        """``{name: (rows, prompt token ids)}`` of ``eval_dataset`` (``rl_inputs.eval_sets``)."""
        out = {}
        limit = agent_prompt_limit(self.config, self.models)
        for name, data in eval_sets(eval_dataset).items():
            label = "eval_dataset" if name is None else f"eval_dataset[{name!r}]"
            rows = load_prompt_dataset(prompt_rows(data), name=label)
            out[name] = (rows, tokenize_prompts(rows, self.tokenizer, limit, self.config.truncate_prompts, label))
        return out

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict:
        """TRL's ``evaluate`` (the module docstring): the trainer's evaluation sets, the one named
        ``eval_dataset``, or a new dataset (or dict of them). ``ignore_keys`` names model outputs,
        which this evaluation does not return. Each set's metrics are also logged to
        ``state.log_history``."""
        if isinstance(eval_dataset, str):
            if eval_dataset not in self.trl_eval_data:
                names = ", ".join(repr(n) for n in self.trl_eval_data if n is not None) or "none"
                raise ValueError(
                    f"evaluate(eval_dataset={eval_dataset!r}): no evaluation set of that name (named: {names})"
                )
            sets = {eval_dataset: self.trl_eval_data[eval_dataset]}
        elif eval_dataset is None:
            if not self.trl_eval_data:
                raise ValueError("Trainer: evaluation requires an eval_dataset.")  # transformers' message
            sets = self.trl_eval_data
        else:
            sets = self.trl_prepare_eval(eval_dataset)
        metrics = {}
        for name, data in sets.items():
            trl, _ = self.trl_evaluate_set(data, metric_key_prefix if name is None else f"{metric_key_prefix}_{name}")
            self.trl_rows.append({**trl, **self.trl_epoch_entry(), "step": self.optimizer_steps_done()})
            metrics.update(trl)
        return metrics

    def trl_evaluate_sets(self) -> tuple[list[dict], dict]:
        """Every evaluation set of the trainer, as a run evaluates them: ``(TRL's rows, rlhfkit's
        eval/* metrics)``."""
        rows, native = [], {}
        for name, data in self.trl_eval_data.items():
            trl, values = self.trl_evaluate_set(data, "eval" if name is None else f"eval_{name}")
            rows.append(trl)
            native.update({("eval/" if name is None else f"eval/{name}/") + k: v for k, v in values.items()})
        return rows, native

    def trl_evaluate_set(self, data: tuple, prefix: str) -> tuple[dict, dict]:
        """``(TRL's metrics, rlhfkit's eval/ names without the prefix)`` of one evaluation set."""
        rows, prompt_ids = data
        a, start = self.trl_args, time.perf_counter()
        group = a.num_generations_eval or a.num_generations
        per_batch = max(1, a.per_device_eval_batch_size * distributed.planned_world() // group)
        making = replace(part(experience.ExperienceMaking, self.config), group_size=group)
        if group < 2:  # one completion per prompt has no baseline: advantage 0 (TRL's RLOO; GRPO's divides by a NaN)
            making = replace(making, advantage_estimator="reinforce")
        losses = part(update.UpdateLoss, self.config)
        beta = self.kl_ctl.value
        totals: dict[str, list[float]] = {}
        batches = 0
        for first in range(0, len(rows), per_batch):
            batch = self.sampler.sample_rows(
                rows[first : first + per_batch],
                prompt_ids[first : first + per_batch],
                group,
                self.sampler.sampling,
                (-1, self.optimizer_steps_done(), first),
                self.weights_version,
            )
            metrics = dict(batch.metrics)
            exp = experience.make_experience(
                self.models, making, batch.rollout, batch.scores, batch.valid, beta, metrics
            )
            if group < 2:
                exp.advantages = torch.zeros_like(exp.advantages)
            metrics.update(advantages.rollout_metrics(exp.rollout))
            everything = torch.arange(exp.mask.shape[0], device=self.models.device)
            with torch.no_grad():
                value, loss_metrics = update.loss(self.models, losses, exp, everything, beta)
            metrics.update(loss_metrics, **{"policy/total_loss": value})
            for k, v in metrics.items():
                totals.setdefault(k, []).append(float(v))
            batches += 1
        native = self.trl_native_eval({k: sum(v) / len(v) for k, v in totals.items()})
        trl = {f"{prefix}_{t}": native[n] for t, n in self.trl_eval_names().items() if n in native}
        runtime = max(time.perf_counter() - start, 1e-9)
        trl[f"{prefix}_runtime"] = round(runtime, 4)
        trl[f"{prefix}_samples_per_second"] = round(len(rows) * group / runtime, 3)
        trl[f"{prefix}_steps_per_second"] = round(batches / runtime, 3)
        return trl, native

    def trl_native_eval(self, means: dict) -> dict:
        """rlhfkit's eval/ names (without ``eval/``) of an evaluation's averaged batch metrics."""
        sources = dict(SOURCES)
        for name in self.sampler.rewards.names:
            sources.update({f"{name}_mean": f"reward/{name}_mean", f"{name}_std": f"reward/{name}_std"})
        if not self.trl_args.beta:
            del sources["kl"]
        return {k: means[v] for k, v in sources.items() if v in means and not math.isnan(means[v])}

    def trl_eval_names(self) -> dict:
        """TRL's evaluation metric names -> rlhfkit's (``EVAL_NAMES`` and the reward functions')."""
        names = dict(EVAL_NAMES)
        for name in self.sampler.rewards.names:
            names.update({f"rewards/{name}/mean": f"{name}_mean", f"rewards/{name}/std": f"{name}_std"})
        return names

    def trl_eval_due(self, step: int) -> bool:
        """Whether TRL evaluates after RL step ``step`` (``eval_strategy="steps"``: an optimizer step
        of the generation is a multiple of ``eval_steps``, ``logging_steps`` when None)."""
        a = self.trl_args
        if not self.trl_eval_data or getattr(a.eval_strategy, "value", a.eval_strategy) != "steps":
            return False
        every = a.eval_steps or a.logging_steps
        return crosses(step, self.optimizer_steps_per_row(), every, self.optimizer_steps_total())


def crosses(step: int, per_step: int, every: float, total: int) -> bool:
    """Whether RL step ``step`` (its optimizer steps ``(step-1) x per_step + 1 .. step x per_step``)
    holds a multiple of ``every`` optimizer steps (``TrainingArguments``: a value below 1 is a share
    of the run's ``total``)."""
    every = math.ceil(every * total) if 0 < every < 1 else int(every)
    return every > 0 and (step * per_step) // every > ((step - 1) * per_step) // every
