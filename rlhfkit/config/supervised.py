"""The supervised trainers' configs: ``TrainConfig``, the fields SFT, the reward model and DPO
share, and one subclass per trainer (``SFTConfig``, ``RewardModelConfig``, ``DPOConfig``, ``KTOConfig``) that
adds its own fields or re-declares a shared one to change its default. Like ``RLConfig``
(``rl.py``) they sit below the trainers, on the shared ``OptimBase`` and ``RunBase`` (``base.py``),
so the run record (``run/record.py``) and the command line's jobs (``jobs.py``) read them without
importing a trainer; the trainer modules re-export them (``from rlhfkit.trainers import SFTConfig``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .base import OptimBase, RunBase, placement_rules, ranged, shared_rules
from .checks import check_fields, check_ranges, check_run_fields

PACKING_STRATEGIES = ("next_fit", "wrapped")


@dataclass(frozen=True)
class TrainConfig(RunBase, OptimBase):
    """Fields shared by the supervised trainers (SFT, reward model); a subclass re-declares a field
    only to change its default."""

    learning_rate: float = ranged(2e-5, "> 0")
    """AdamW peak learning rate. 2e-5 is TRL's SFT default for full fine-tuning of real models; tiny random models
    (tests, demos) want about 1e-3."""
    lr_scheduler: str = "cosine"
    """After warmup: constant, linear (decay to 0 at the last step) or cosine (Loshchilov & Hutter 2017) (SCHEDULERS).
    hf_constant, hf_linear, hf_cosine: transformers' formulas (the TRL drop-in configs select them), whose warmup starts
    at learning rate 0."""
    log_every: int = ranged(10, "[0, 1e9]")
    """Print a progress line every this many steps (0: silent); metrics.jsonl gets every step."""
    num_epochs: float = ranged(1.0, "(0, 1e6]")
    """Passes over the training data when max_steps is None (fractions allowed)."""
    max_steps: int | None = ranged(None, "[0, 1e9] or None")
    """Optimizer steps to run; None: from num_epochs."""
    batch_size: int = ranged(8, "[1, 1e6]")
    """Rows per forward/backward: SFT examples (or packed rows of max_length tokens), or preference pairs for a reward
    model (each pair scores 2 sequences). Under torchrun it counts the rows of every process together: each process
    takes its 1/N share, so N processes train what one does."""
    grad_accumulation: int = ranged(1, "[1, 1e6]")
    """Micro-batches of batch_size rows per optimizer step (gradient accumulation): a step trains on batch_size x
    grad_accumulation rows with the loss of one batch that large (SFT: the mean over every completion token of the step;
    DPO and the reward model: the mean over the step's pairs)."""
    max_length: int = ranged(1024, "[2, 1e7]")
    """Tokens per sequence (prompt + completion + EOS; longer: the prompt's start goes first, then for SFT the
    completion's end; a reward model drops pairs whose completion does not fit, as TRL does), and the packed row
    length."""
    eval_every: int = ranged(0, "[0, 1e9]")
    """Evaluate on eval_dataset every this many optimizer steps (0: only after the last step)."""
    dtype: str = "float32"
    """Weights dtype when the model is loaded from a directory: float32, bfloat16 or float16 (DTYPES)."""
    device: str = "auto"
    """Where the model runs: 'auto' (the GPU of this process when torch sees one, else the CPU), 'cpu', 'cuda',
    'cuda:N'."""
    autocast: str | None = None
    """Mixed precision: 'bfloat16' (or 'float16') runs the forward and backward matmuls in that dtype under
    torch.autocast while weights, gradients and AdamW states stay in dtype (use with float32). None: off."""
    parallelism: str = "fsdp"
    """With several processes (torchrun): 'fsdp' shards the model with FSDP2 (each process holds 1/N of the weights,
    gradients and AdamW states); 'ddp' keeps a full copy per process and averages gradients. Each process trains on its
    share of every step's rows (batch_size stays the global count). Ignored in a single process."""

    def __post_init__(self):
        check_ranges(self)
        check_run_fields(self)
        check_fields(self, shared_rules(self) + placement_rules(self))

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class SFTConfig(TrainConfig):
    """Everything an SFT run reads. ``SFTConfig(learning_rate=1e-3, max_steps=40, batch_size=4)``."""

    num_epochs: float = ranged(3.0, "(0, 1e6]")
    """Passes over the training data when max_steps is None (fractions allowed); TRL's default is 3."""
    packing: bool = False
    """Pack examples into rows of max_length tokens; position ids restart at 0 per example (see
    data.sft.collate_groups)."""
    packing_strategy: str = "next_fit"
    """How packing fills rows: 'next_fit' (examples whole and in order, a new row when the next does not fit; each
    attends to itself only) or 'wrapped' (TRL's: every example's tokens one after another, cut every max_length tokens;
    an example may be split, and a row is one sequence, attending across examples)."""
    completion_only_loss: bool = True
    """Train on the completion of 'prompt'/'completion' rows only (False: on the prompt's tokens too), as TRL's field of
    that name (whose None means True for such rows)."""
    assistant_only_loss: bool = True
    """Train on the assistant turns of 'messages' rows only (False: on every token of the conversation: system, user and
    tool turns too). TRL's field of that name defaults to False; rlhfkit's to True."""
    loss_type: str = "nll"
    """The per-token loss (algorithms/sft_losses.py): 'nll' (cross-entropy) or 'dft' (Dynamic Fine-Tuning, Wu et al.
    2025, arXiv:2508.05629: each token's cross-entropy weighted by its probability, held constant)."""
    chat_template: str | None = None
    """The chat template that renders 'messages' rows (and is saved with the model in final/): 'chatml_tools' (shipped:
    ChatML with tool calls, Hermes/Qwen2.5 form, for ChatML models whose own template has no tools, e.g. SmolLM2), a
    path to a Jinja file, or the template itself inline (text with '{%' or '{{'); None: the tokenizer's own. Multi-turn
    rows (several assistant turns, tool calls) are rendered once with a prefix-preserving template; with one that
    rewrites history (Qwen3's <think> handling) each assistant turn is trained after the template's rendering of the
    conversation before it (several examples per conversation)."""

    def __post_init__(self):
        from ..algorithms.sft_losses import SFT_LOSS_TYPES  # torch only when an SFT config is built

        super().__post_init__()
        check_fields(
            self,
            [
                (self.loss_type in SFT_LOSS_TYPES, "loss_type", f"one of {', '.join(SFT_LOSS_TYPES)}"),
                (self.packing_strategy in PACKING_STRATEGIES, "packing_strategy", "'next_fit' or 'wrapped'"),
            ],
        )


@dataclass(frozen=True)
class RewardModelConfig(TrainConfig):
    """Everything a reward-model run reads. ``RewardModelConfig(learning_rate=1e-5, batch_size=8)``."""

    learning_rate: float = ranged(1e-5, "> 0")
    """AdamW peak learning rate (InstructGPT's 6B RM used 9e-6). One epoch (the default num_epochs): reward models
    overfit after the first (Ouyang et al. 2022, appendix C.2)."""
    lr_scheduler: str = "linear"
    """After warmup: constant, linear (decay to 0 at the last step) or cosine. hf_constant, hf_linear, hf_cosine:
    transformers' formulas (the TRL drop-in configs select them), whose warmup starts at learning rate 0."""
    log_every: int = ranged(1, "[0, 1e9]")
    """Print a progress line every this many steps (0: silent)."""
    center: bool = True
    """After training, store the mean score of center_dataset (default: the training completions) as the offset, so
    scores are centred at 0."""
    center_rewards_coefficient: float | None = ranged(None, ">= 0 or None")
    """Add this times the mean over pairs of (r_chosen + r_rejected)^2 to the loss, pulling scores toward 0 during
    training (Eisenstein et al. 2023, as TRL's field of that name); None: off."""


@dataclass(frozen=True)
class DPOConfig(TrainConfig):
    """Everything a DPO run reads. ``DPOConfig(beta=0.1, loss_type="sigmoid", learning_rate=1e-6)``."""

    learning_rate: float = ranged(1e-6, "> 0")
    """AdamW peak learning rate; 1e-6 is TRL's DPO default for real models (tiny random models want ~1e-3)."""
    lr_scheduler: str = "linear"
    """After warmup: constant, linear (decay to 0 at the last step) or cosine. hf_constant, hf_linear, hf_cosine:
    transformers' formulas (the TRL drop-in configs select them), whose warmup starts at learning rate 0."""
    beta: float = ranged(0.1, "> 0")
    """β: the strength of the implicit KL leash to the reference (DPO, hinge), IPO's τ (the target margin is 1/(2β)), or
    SimPO's reward scale."""
    loss_type: str | tuple[str, ...] = "sigmoid"
    """sigmoid (DPO; with label_smoothing > 0 conservative DPO), ipo, hinge (SLiC), simpo (reference-free,
    length-normalised), robust (robust DPO), nca_pair (NCA), sppo_hard (SPPO), apo_zero or apo_down (APO), bco_pair
    (BCO), exo_pair (EXO), discopop (DiscoPOP), aot or aot_unpaired (AOT), sigmoid_norm (length-normalised DPO), sft
    (the chosen completions' NLL); or several, summed with loss_weights (MPO: sigmoid, bco_pair, sft). The formulas and
    papers: algorithms/dpo.py."""
    loss_weights: tuple[float, ...] | None = None
    """One weight per loss_type when it names several (None: 1 each)."""
    label_smoothing: float = ranged(0.0, "[0, 0.5)")
    """sigmoid, robust, exo_pair, aot and aot_unpaired only (each listed loss that takes it): the assumed probability ε
    that a label is flipped (conservative DPO, Mitchell 2023; robust DPO, Chowdhury et al. 2024; AOT), EXO's label
    smoothing (> 0; 1e-3 in its paper); 0 is plain DPO."""
    simpo_gamma: float = ranged(0.5, "finite")
    """simpo only: the target reward margin γ of SimPO (Meng et al. 2024)."""
    discopop_tau: float = ranged(0.05, "> 0")
    """discopop only: the temperature τ of DiscoPOP's log-ratio modulation (Lu et al. 2024)."""
    f_divergence_type: str = "reverse_kl"
    """The divergence to the reference the margin losses regularise with (f-DPO, Wang et al. 2023): reverse_kl (DPO),
    forward_kl, js_divergence or alpha_divergence; not with the losses that score the completions apart."""
    f_alpha_divergence_coef: float = ranged(0.5, "finite")
    """alpha_divergence only: its α (TRL's convention)."""
    ld_alpha: float | None = ranged(None, "[0, 1] or None")
    """LD-DPO (Liu et al. 2024): weight in [0, 1] of the tokens of the longer completion past the shorter one's length
    in its log-prob (both policy and reference); None: 1, plain DPO."""
    use_weighting: bool = False
    """WPO (Zhou et al. 2024): weigh each pair's loss by how likely the policy is to produce its two completions
    (length-normalised, against its own distribution's self-probability); not with aot / aot_unpaired (they sort the
    batch). Costs a second pass of the policy without gradient a micro-batch (algorithms/dpo_terms.py)."""
    precompute_ref_logprobs: bool = False
    """Score every training pair under the reference once, before training, and free the reference: no second model in
    memory during training (the same loss: the reference is frozen)."""
    sync_ref_model: bool = False
    """TR-DPO (Gorbatovski et al. 2024): every ref_model_sync_steps optimizer steps the reference becomes
    ref_model_mixup_alpha x policy + (1 - ref_model_mixup_alpha) x reference. Not with a LoRA policy (its reference is
    the base model) nor precompute_ref_logprobs."""
    ref_model_mixup_alpha: float = ranged(0.6, "(0, 1]")
    """sync_ref_model only: α, the policy's share of the new reference."""
    ref_model_sync_steps: int = ranged(512, "[1, 1e9]")
    """sync_ref_model only: τ, optimizer steps between two syncs."""

    def __post_init__(self):
        from ..algorithms.dpo import check_loss_settings  # torch only when a DPO config is built

        for name in ("loss_type", "loss_weights"):  # a list from YAML or TRL: a tuple
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        super().__post_init__()
        try:
            check_loss_settings(self.loss_type, self.loss_weights, self.label_smoothing, self.f_divergence_type)
        except ValueError as e:
            raise ValueError(f"DPOConfig: {e}") from None
        check_fields(
            self,
            [
                (
                    not (self.use_weighting and {"aot", "aot_unpaired"} & set(_names(self.loss_type))),
                    "use_weighting",
                    "False with loss_type 'aot' or 'aot_unpaired' (they sort the batch: no weight belongs to a pair)",
                ),
                (
                    not (self.sync_ref_model and self.precompute_ref_logprobs),
                    "sync_ref_model",
                    "False with precompute_ref_logprobs=True (a reference that changes cannot be scored once)",
                ),
            ],
        )


def _names(loss_type) -> tuple[str, ...]:
    return (loss_type,) if isinstance(loss_type, str) else tuple(loss_type)


@dataclass(frozen=True)
class KTOConfig(TrainConfig):
    """Everything a KTO run reads: unpaired preferences, each row a prompt, a completion and a label (thumbs up or
    down). ``KTOConfig(beta=0.1, desirable_weight=1.0, undesirable_weight=1.33, learning_rate=1e-6)``."""

    learning_rate: float = ranged(1e-6, "> 0")
    """AdamW peak learning rate; 1e-6 is TRL's KTO default for real models (tiny random models want ~1e-3)."""
    lr_scheduler: str = "linear"
    """After warmup: constant, linear (decay to 0 at the last step) or cosine. hf_constant, hf_linear, hf_cosine:
    transformers' formulas (the TRL drop-in configs select them), whose warmup starts at learning rate 0."""
    batch_size: int = ranged(8, "[1, 1e6]")
    """Rows per forward/backward (each scores its completion and, for loss_type kto, another row's completion after
    its prompt: KTO's KL estimate is over a micro-batch, so each process needs at least 2 rows). Under torchrun it
    counts the rows of every process together."""
    beta: float = ranged(0.1, "> 0")
    """β: the scale of the implicit reward β log(π/π_ref) inside the sigmoid; larger keeps the policy nearer the
    reference."""
    loss_type: str = "kto"
    """kto (Ethayarajh et al. 2024: each completion's reward against the batch's KL estimate z0) or apo_zero_unpaired
    (APO-zero on unpaired rows: raise the desirable completions' likelihood, lower the undesirable ones'; no KL
    estimate). The formulas: algorithms/kto.py."""
    desirable_weight: float = ranged(1.0, ">= 0")
    """λ_D: the weight of the desirable rows' losses. With unequal counts the paper recommends λ_D n_D / (λ_U n_U) in
    [1, 4/3]; a warning says when both weights are outside that range."""
    undesirable_weight: float = ranged(1.0, ">= 0")
    """λ_U: the weight of the undesirable rows' losses."""
    shuffle: bool = True
    """A seeded shuffle of the rows every epoch; False: the dataset's order every epoch (TRL's KTO reads its rows in
    order, so that the mismatched pairs of its KL estimate are fixed)."""
    precompute_ref_logprobs: bool = False
    """Score every row (and the mismatched pairs it will be in) under the reference once, before training, and free the
    reference: no second model in memory during training (the same loss: the reference is frozen)."""
    sync_ref_model: bool = False
    """TR-DPO's soft update of the reference (Gorbatovski et al. 2024): every ref_model_sync_steps optimizer steps the
    reference becomes ref_model_mixup_alpha x policy + (1 - ref_model_mixup_alpha) x reference. Not with a LoRA policy
    nor precompute_ref_logprobs."""
    ref_model_mixup_alpha: float = ranged(0.6, "(0, 1]")
    """sync_ref_model only: α, the policy's share of the new reference."""
    ref_model_sync_steps: int = ranged(512, "[1, 1e9]")
    """sync_ref_model only: τ, optimizer steps between two syncs."""

    def __post_init__(self):
        from ..algorithms.kto import KTO_LOSS_TYPES  # torch only when a KTO config is built

        super().__post_init__()
        check_fields(
            self,
            [
                (self.loss_type in KTO_LOSS_TYPES, "loss_type", f"one of {', '.join(KTO_LOSS_TYPES)}"),
                (
                    not (self.sync_ref_model and self.precompute_ref_logprobs),
                    "sync_ref_model",
                    "False with precompute_ref_logprobs=True (a reference that changes cannot be scored once)",
                ),
            ],
        )
