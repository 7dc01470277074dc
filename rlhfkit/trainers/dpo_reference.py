"""The DPO trainer's reference π_ref: which model it is, its log-probs computed now or once before
training (``precompute_ref_logprobs``), and TR-DPO's syncing of it toward the policy.

Which model: ``ref_model`` when given (a directory, Hub id or model object); the adapter-disabled
base when the policy is a LoRA model (no second copy); else a frozen copy of the initial policy —
or, with ``precompute_ref_logprobs``, no copy at all: the policy itself scores the pairs before its
first update (as TRL does).

``precompute_ref_logprobs``: every pair the trainer holds when it is built (the training pairs and
the evaluation pairs) is scored once, before training, into a table keyed by the pair's tokens; a
reference loaded from a path is then freed when training starts (no second model in memory during
training). Pairs that arrive later (a new evaluation set) are scored while a reference still
exists: a LoRA base, a reference model object (its caller holds it anyway), or the policy before
its first update; otherwise one line says why not.

``sync_ref_model`` (TR-DPO: Gorbatovski et al. 2024, "Learn Your Reference Model for Real Good
Alignment", arXiv:2404.09656, the soft update): every ``ref_model_sync_steps`` optimizer
steps ``π_ref ← α π_θ + (1 - α) π_ref`` (``ref_model_mixup_alpha`` α), parameter by parameter, as
TRL's ``SyncRefModelCallback``. The reference's weights then change during training, so checkpoints
hold them beside the policy's (the optimizer does not train them) and a resumed run continues with
the reference it had.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from typing import Any

import torch

from .. import distributed
from ..config.supervised import DPOConfig, KTOConfig
from ..models import freeze, load_causal_lm, soft_update
from ..models.lora import is_peft


def pair_key(pair) -> tuple:
    """The table key of a preference pair: its tokens (the same pair always has the same reference log-probs)."""
    return tuple(pair.prompt), tuple(pair.chosen), tuple(pair.rejected)


class DPOReference:
    """Mixed into the DPO and KTO trainers: ``_build_reference`` once its policy is on its device,
    ``_reference_table`` before training, ``_reference_of`` in each loss, ``_reference_step`` after
    each optimizer step."""

    # the DPO trainer's (trainers/dpo.py), or the KTO trainer's (trainers/kto.py: its items are a row's
    # completion and the mismatched one of its KL estimate, in place of a pair's two completions)
    args: DPOConfig | KTOConfig
    model: Any  # a causal LM, or a peft model of one
    train_model: torch.nn.Module
    device: torch.device
    needs_reference: bool
    step: int
    _logps: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    # this mixin's
    reference: torch.nn.Module | None
    _ref_table: dict[tuple, tuple[float, float]] | None
    _policy_is_initial: bool
    _free_reference: bool
    _reference_key: Callable[[Any], tuple] = staticmethod(pair_key)  # an item's table key (KTO's items: their own)

    def _build_reference(self, ref_model) -> None:
        args = self.args
        self.reference, self._ref_table = None, None
        self._policy_is_initial = True  # the policy's weights are still the reference's (no update, no resume)
        path = isinstance(ref_model, (str, os.PathLike))
        self._free_reference = args.precompute_ref_logprobs and path
        if not self.needs_reference:
            return
        lora = is_peft(self.model)
        if args.sync_ref_model and lora:
            raise ValueError(  # TRL's refusal
                "sync_ref_model=True with a LoRA (PEFT) policy is not supported: its reference is the base model "
                "with the adapter disabled, no separate model to synchronise; train the full model or set "
                "sync_ref_model=False"
            )
        if ref_model is not None:
            self.reference = freeze(load_causal_lm(ref_model, args.dtype if path else None)).to(self.device)
        elif not lora and not args.precompute_ref_logprobs:
            self.reference = freeze(load_causal_lm(copy.deepcopy(self.model), None)).to(self.device)
        if args.sync_ref_model:
            self._check_sync()

    def _check_sync(self) -> None:
        """The reference mixes with the policy parameter by parameter: the same names and shapes. Its
        weights become state a checkpoint holds (trainable to the checkpoint, not to the optimizer)."""
        assert self.reference is not None
        mine = {n: tuple(p.shape) for n, p in self.model.named_parameters()}
        theirs = {n: tuple(p.shape) for n, p in self.reference.named_parameters()}
        if mine != theirs:
            odd = sorted(set(mine.items()) ^ set(theirs.items()))[0][0]
            raise ValueError(
                "sync_ref_model=True needs a ref_model of the policy's architecture (TR-DPO mixes their weights "
                f"parameter by parameter): parameter {odd!r} differs"
            )
        self.reference.requires_grad_(True)  # no gradient reaches it (scored under no_grad): checkpointed only

    def _reference_modules(self) -> dict[str, torch.nn.Module]:
        """What checkpoints hold of the reference: the synced one (TR-DPO), else nothing (it is fixed)."""
        return {"reference": self.reference} if self.args.sync_ref_model and self.reference is not None else {}

    # ---------------------------------------------------------------- log-probs
    @torch.no_grad()
    def _reference_logps(self, pairs: list) -> torch.Tensor:
        """The reference's summed log-probs (2n,) of ``pairs``: chosen rows, then rejected."""
        if self.reference is not None:
            return self._logps(self.reference, pairs)[0]
        if is_peft(self.model):
            with self.model.disable_adapter():  # LoRA: the base model is the reference
                return self._logps(self.train_model, pairs)[0]
        if self._policy_is_initial:  # precompute_ref_logprobs without ref_model: the policy before any update
            return self._logps(self.train_model, pairs)[0]
        raise ValueError(
            f"precompute_ref_logprobs=True: {len(pairs)} pair(s) were not scored by the reference before training, "
            "and the reference is gone (the policy before its first update, or a ref_model directory freed when "
            "training began): give them as eval_dataset when the trainer is built, or pass ref_model as a model "
            "object"
        )

    def _reference_available(self) -> bool:
        """Whether pairs not in the table can still be scored (``_reference_logps``)."""
        return self.reference is not None or is_peft(self.model) or self._policy_is_initial

    def _reference_table(self, pairs: list) -> None:
        """With ``precompute_ref_logprobs``: score the ``pairs`` the table lacks (every process calls
        this with the same pairs: each scores its slice, the slices are summed over processes)."""
        if self._ref_table is None:
            self._ref_table = {}
        todo = list(
            {self._reference_key(p): p for p in pairs if self._reference_key(p) not in self._ref_table}.values()
        )
        if not todo:
            return
        world, rank, n = distributed.role_size(), distributed.role_rank(), len(todo)
        lo, hi = n * rank // world, n * (rank + 1) // world
        size = max(1, self.args.batch_size // world)
        starts = list(range(lo, hi, size))
        out = torch.zeros(2, n, dtype=torch.float64)
        was_training = self.model.training
        self.train_model.eval()
        try:
            for k in range(distributed.reduce_max(len(starts))):  # as many passes on every process
                chunk = todo[starts[k] : min(starts[k] + size, hi)] if k < len(starts) else todo[:1]
                logps = self._reference_logps(chunk).double().cpu().view(2, -1)
                if k < len(starts):
                    out[:, starts[k] : starts[k] + len(chunk)] = logps
        finally:
            self.train_model.train(was_training)
            distributed.reshard(self.train_model)  # FSDP2: the optimizer and checkpoints hold the shards
        out = torch.tensor(distributed.sum_floats(out.flatten().tolist()), dtype=torch.float64).view(2, n)
        self._ref_table.update(
            {self._reference_key(p): (out[0, i].item(), out[1, i].item()) for i, p in enumerate(todo)}
        )

    def _reference_of(self, pairs: list) -> torch.Tensor:
        """The reference's log-probs (2n,) of ``pairs`` for the loss: from the table (precomputed) or now."""
        if not self.args.precompute_ref_logprobs:
            return self._reference_logps(pairs)
        assert self._ref_table is not None
        rows = [self._ref_table[self._reference_key(p)] for p in pairs]  # _reference_table ran over every set first
        return torch.tensor([r[0] for r in rows] + [r[1] for r in rows], dtype=torch.float32, device=self.device)

    # ---------------------------------------------------------------- during training
    def _reference_begin(self) -> None:
        """When training starts: a reference loaded from a directory only to precompute is freed."""
        if self._free_reference:
            self.reference = None

    def _reference_step(self) -> None:
        """After optimizer step ``self.step``: the policy has moved; TR-DPO's sync when one is due."""
        self._policy_is_initial = False
        args = self.args
        if args.sync_ref_model and self.step % args.ref_model_sync_steps == 0:
            assert self.reference is not None  # _build_reference built one (sync refuses LoRA and precompute)
            soft_update(self.reference, self.model, args.ref_model_mixup_alpha)
