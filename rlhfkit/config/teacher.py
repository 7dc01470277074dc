"""The teacher's fields of ``RLConfig`` (``rl.py``): on-policy distillation, a frozen teacher model whose
judgement of the policy's own sampled tokens is one more per-token signal of the one RL loop, beside (or
instead of) the rewards. ``TeacherConfig`` declares the fields with their docs; ``check_teacher`` holds the
rules among them (the part checks itself; ``rl.py`` calls it with the other checks)."""

from __future__ import annotations

from dataclasses import dataclass

from .base import preset, ranged

DISTILLATION_MODES = ("token", "full")


@dataclass(frozen=True)
class TeacherConfig:
    teacher_model: str | None = None
    """The teacher of on-policy distillation: a Hugging Face directory (or GGUF file) of a causal LM with the
    policy's tokenizer (a different vocabulary is refused, naming what differs). ``RLTrainer(teacher_model=...)``
    also takes a model object. Loaded frozen beside the reference, in ``dtype``, sharded as it is under torchrun.
    With ``teacher_url``: the served model's id (the ``model`` of each request; None: the server's default model).
    None: no teacher."""
    teacher_url: str | None = None
    """A teacher served elsewhere: the base URL of an OpenAI-compatible server (``rlhfkit serve`` or ``vllm serve``,
    e.g. ``http://host:8000/v1``) whose ``/completions`` returns ``prompt_logprobs`` as vLLM's does (TRL's
    ``teacher_model_server_url``). The policy's sampled ids (prompt + completion, never re-tokenised) are sent as
    token ids and the teacher's log-prob of each sampled token is read back, at temperature 1 (the server's raw
    log-probs), so it needs ``temperature`` 1 and ``distillation_mode`` 'token'. None: the teacher is local."""
    teacher_batch_size: int = ranged(8, "[1, 1e6]")
    """With ``teacher_url``: sequences per request (TRL's ``chunk_size``); a step's rows go in requests of this
    many, one after another."""
    teacher_retries: int = ranged(2, "[0, 100]")
    """With ``teacher_url``: how many times a failed request (refused connection, HTTP 5xx or 429, time limit) is
    sent again, after 1, 2, 4, ... s, before the run stops in one line naming ``teacher_url`` (its last
    checkpoint untouched). A 4xx answer is not retried: the request itself is wrong."""
    teacher_timeout: float = ranged(120.0, "(0, 1e6]")
    """With ``teacher_url``: seconds one request may take (connecting and answering) before it counts as failed."""
    distillation_coef: float = preset(">= 0")
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
    distillation_beta: float = ranged(1.0, "[0, 1]")
    """With distillation_mode 'full': the generalized Jensen-Shannon divergence's β (TRL's beta): 0 the forward
    KL(π_teacher‖π), 1 the reverse KL(π‖π_teacher), between them β KL(π_teacher‖m) + (1-β) KL(π‖m) with
    m = (1-β) π + β π_teacher. Both distributions at the sampling temperature."""


def distillation_weight(c) -> float:
    """λ, the teacher's weight (``distillation_coef``, which the preset fills: 0 when it is unset); 0 means no
    teacher term. ``c``: an ``RLConfig`` or a part of it that takes the field."""
    return float(c.distillation_coef or 0.0)


def check_teacher(c) -> list[tuple[bool, str, str]]:
    """The rules among the teacher's fields, as ``check_fields`` entries. Whether a teacher exists when
    ``distillation_coef > 0`` is the trainer's check (a model object is no config field). A served teacher
    (``teacher_url``) gives the log-probs of the tokens it is sent, at temperature 1: no full distributions, no
    other temperature."""
    served = c.teacher_url is not None
    return [
        (c.distillation_mode in DISTILLATION_MODES, "distillation_mode", f"one of {', '.join(DISTILLATION_MODES)}"),
        (
            (c.teacher_model is None and not served) or c.distillation_coef > 0,
            "distillation_coef",
            "> 0 with a teacher_model or teacher_url (0 would ask the teacher and use it for nothing)",
        ),
        (
            not served or str(c.teacher_url).startswith(("http://", "https://")),
            "teacher_url",
            "an http:// or https:// base URL of an OpenAI-compatible server (e.g. http://host:8000/v1)",
        ),
        (
            not served or c.distillation_mode == "token",
            "distillation_mode",
            "'token' with teacher_url (a server returns the log-probs of a few tokens per position, not the whole "
            "distribution the 'full' divergence streams through both output layers)",
        ),
        (
            not served or c.temperature == 1.0,
            "temperature",
            "1.0 with teacher_url (a server's prompt log-probs are at temperature 1; the student's must be too)",
        ),
    ]
