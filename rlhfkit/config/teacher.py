"""The teacher's fields of ``RLConfig`` (``rl.py``): on-policy distillation, a frozen teacher model whose
judgement of the policy's own sampled tokens is one more per-token signal of the one RL loop, beside (or
instead of) the rewards. ``TeacherConfig`` declares the fields with their docs; ``check_teacher`` holds the
rules among them (the part checks itself; ``rl.py`` calls it with the other checks)."""

from __future__ import annotations

from dataclasses import dataclass

DISTILLATION_MODES = ("token", "full")


@dataclass(frozen=True)
class TeacherConfig:
    teacher_model: str | None = None
    """The teacher of on-policy distillation: a Hugging Face directory (or GGUF file) of a causal LM with the
    policy's tokenizer (a different vocabulary is refused, naming what differs). ``RLTrainer(teacher_model=...)``
    also takes a model object. Loaded frozen beside the reference, in ``dtype``, sharded as it is under torchrun.
    None: no teacher."""
    distillation_coef: float | None = None
    """Weight of the teacher's signal (λ below); 0 turns distillation off. Presets: 0, except ``distill`` (1: the
    teacher alone, no reward needed). With reward functions as well, the run is RL with a teacher: the rewards'
    advantages plus λ times the teacher's term (Qwen3's and Tinker's recipes mix them this way)."""
    distillation_mode: str = "token"
    """What the teacher's judgement becomes. 'token': each sampled token's advantage gains
    −λ (log π_old(y_t) − log π_teacher(y_t)), the sampled-token estimate of the reverse KL(π‖π_teacher), trained
    by the policy loss with no discount (on-policy distillation as Agarwal et al. 2024, arXiv:2306.13649, and
    Thinking Machines' 2025 recipe run it: one teacher pass per step). 'full': λ times the divergence between
    the policy's and the teacher's whole next-token distributions at every sampled position is added to the loss
    (distillation_beta chooses it; both output layers are read in chunks, no tokens × vocabulary tensor;
    TRL's DistillationTrainer)."""
    distillation_beta: float = 1.0
    """With distillation_mode 'full': the generalized Jensen-Shannon divergence's β (TRL's beta): 0 the forward
    KL(π_teacher‖π), 1 the reverse KL(π‖π_teacher), between them β KL(π_teacher‖m) + (1-β) KL(π‖m) with
    m = (1-β) π + β π_teacher. Both distributions at the sampling temperature."""


def check_teacher(c) -> list[tuple[bool, str, str]]:
    """The rules among the teacher's fields, as ``check_fields`` entries. Whether a teacher exists when
    ``distillation_coef > 0`` is the trainer's check (a model object is no config field)."""
    return [
        (c.distillation_mode in DISTILLATION_MODES, "distillation_mode", f"one of {', '.join(DISTILLATION_MODES)}"),
        (
            c.teacher_model is None or c.distillation_coef > 0,
            "distillation_coef",
            "> 0 with a teacher_model (0 would load the teacher and use it for nothing)",
        ),
    ]
