"""The models of the RL loop: the policy, its critic and its reference, built from a path or an
object and sharded under torchrun (``RLModels``, ``build_models``).

The rollout a forward pass reads (``rlhfkit.rollout.Rollout``: ``input_ids``, ``attention_mask``,
``response_mask``, ``prompt_index``, ``logprobs``, ``select``) is only duck-typed here: the models
sit below the rollout engines, which generate with them, so this module never imports them.
"""

from __future__ import annotations

import copy
from contextlib import nullcontext
from pathlib import Path
from typing import Protocol

import torch

from .. import distributed
from ..config.parts import ConfigFields, takes
from ..config.teacher import distillation_weight
from .activations import checkpointable_layers, decoder_layer_count, measure_activation_cost, probe_ids
from .heads import ScalarModel
from .lm_head import streamable
from .loading import enable_activation_checkpointing, freeze, load_causal_lm
from .lora import export_causal_lm, unsharded_template
from .memory import MemoryPlan
from .micro_batches import padded_tokens, row_spans, split_rows, token_budget
from .policy import ResponseForward
from .remote_teacher import RemoteTeacher
from .segments import forward_rollout, rollout_values
from .teacher import check_heads, load_teacher


class RolloutBatch(Protocol):
    """What the forward passes read of a rollout (``rlhfkit.rollout.Rollout`` has it all; the
    models never import it)."""

    @property
    def input_ids(self) -> torch.Tensor: ...
    @property
    def attention_mask(self) -> torch.Tensor: ...
    @property
    def response_mask(self) -> torch.Tensor: ...
    @property
    def prompt_index(self) -> torch.Tensor | None: ...
    @property
    def logprobs(self) -> torch.Tensor | None: ...
    def select(self, rows: torch.Tensor) -> RolloutBatch: ...


@takes(
    "kl_coef",
    "use_critic",
    "critic",
    "critic_init",
    "dtype",
    "parallelism",
    "autocast",
    "temperature",
    "top_k",
    "top_p",
    "share_prompt",
    "micro_batch_size",
    "max_tokens_per_micro_batch",
    "save_adapter",
    "gradient_checkpointing",
    "memory_budget_gb",
    "distillation_coef",
    "distillation_mode",
    "lm_head",
)
class ModelSetup(ConfigFields):
    """The fields of ``RLConfig`` that ``RLModels`` reads: which models it builds (a reference when
    ``kl_coef > 0``, a critic, a teacher when ``distillation_coef > 0``), how they are sharded, how their
    forward passes run (``lm_head``: how they read the output layer), and the activation memory policy."""


class RLModels:
    """The three models of the RL loop and the forward passes it runs on them.

    - ``policy``: the causal LM being trained (a ``peft`` model when training a LoRA adapter).
    - the critic (``args.use_critic``): a separate ``ScalarModel`` (``critic='separate'``: a copy
      of the policy's backbone with a scalar head, or ``critic_init``) in ``critic``, or a value head
      on the policy's own last hidden state (``critic='shared'``, zero-initialised) in
      ``value_head``; ``critic_module`` is whichever there is.
    - ``reference`` (``kl_coef > 0``): a frozen copy of the initial policy (or ``ref_model``); with a
      LoRA policy and no ``ref_model`` it stays None and the reference is the policy with its
      adapter disabled — no second copy.
    - ``teacher`` (``distillation_coef > 0``): the frozen teacher of on-policy distillation
      (``models.teacher.load_teacher``), sharded as the reference is; ``teacher_logprobs`` and
      ``teacher_hidden`` read it.

    Forward passes: ``policy_outputs`` (old log-probs and values before an update, no gradient),
    ``train_outputs`` (log-probs, values and entropy of a micro-batch, with gradients) and
    ``reference_logprobs``; under torchrun they run on the sharded modules (``train_policy``,
    ``train_critic``). Each reads the output layer as ``args.lm_head`` says (``models.lm_head``).
    ``save_policy`` writes the policy as a Hugging Face directory.
    """

    def __init__(
        self, policy, tokenizer, args: ModelSetup, ref_model=None, generation_only: bool = False, teacher=None
    ):
        self.policy, self.tokenizer, self.args = policy, tokenizer, args
        self.device = next(policy.parameters()).device
        self.is_peft = hasattr(policy, "disable_adapter") and hasattr(policy, "peft_config")
        self.reference = self.critic = self.value_head = self.teacher = None
        self.memory: MemoryPlan | None = None  # plan_memory
        self.train_critic: torch.nn.Module | None  # the critic the passes run (sharded), when there is one
        self._peft_template: torch.nn.Module | None  # save_policy's unsharded LoRA copy (lora.unsharded_template)
        if generation_only:  # a generator rank: the policy alone, unsharded, given the trainers' weights
            self.train_policy, self.train_critic, self._peft_template = policy, None, None
            self._probe_output_layers()
            return
        if args.kl_coef > 0 and (ref_model is not None or not self.is_peft):
            ref = ref_model if ref_model is not None else copy.deepcopy(policy)
            self.reference = freeze(load_causal_lm(ref, args.dtype if ref_model is not None else None)).to(self.device)
        if args.use_critic and args.critic == "shared":
            hidden = policy.config.hidden_size
            # Zero init: every value starts at 0, so the first advantages are the plain returns.
            self.value_head = torch.nn.Linear(hidden, 1).to(self.device, next(policy.parameters()).dtype)
            torch.nn.init.zeros_(self.value_head.weight)
            torch.nn.init.zeros_(self.value_head.bias)
        elif args.use_critic:
            self.critic = (
                ScalarModel.from_pretrained(args.critic_init, args.dtype)
                if args.critic_init
                else ScalarModel.from_causal_lm(_base_causal_lm(policy))
            ).to(self.device)
            if args.gradient_checkpointing != "off":  # its layers as the policy's (plan_memory decides each pass)
                enable_activation_checkpointing(self.critic.backbone)
        if distillation_weight(args) > 0:
            if teacher is None:
                raise ValueError(
                    f"distillation_coef is {args.distillation_coef} but there is no teacher: set teacher_model "
                    "(a model directory) or pass RLTrainer(teacher_model=...)"
                )
            served = isinstance(teacher, RemoteTeacher)  # teacher_url: scored by a server, nothing loaded
            self.teacher = teacher if served else load_teacher(teacher, tokenizer, args.dtype, self.device)
            if args.distillation_mode == "full" and served:
                raise ValueError(
                    "distillation_mode='full' needs a local teacher (teacher_url gives no full "
                    "distributions): use distillation_mode='token'"
                )
            if args.distillation_mode == "full":
                check_heads(policy, self.teacher)
        self._shard()
        self._probe_output_layers()

    def _probe_output_layers(self) -> None:
        """Whether each local model's passes stream its output layer under ``args.lm_head``
        (``lm_head.streamable``), asked now, at setup: the one-token probe runs here on every process
        alike, not inside the first training step."""
        for m in (self.policy, self.reference, self.teacher):
            if isinstance(m, torch.nn.Module):  # not a served teacher (teacher_url)
                streamable(m, self.args.lm_head)

    def _shard(self) -> None:
        """Under torchrun, shard the policy, the critic and the frozen reference over the processes
        (``distributed.shard``: FSDP2, or DDP for the trained ones). Training passes go through
        ``train_policy`` / ``train_critic`` (the FSDP2 module itself, or a DDP wrapper); generation
        uses the policy with its parameters gathered. A single process: the models as they are."""
        args = self.args
        # A LoRA policy is merged at save time into a full copy, which a sharded one no longer is.
        self._peft_template = unsharded_template(self.policy)
        mixed = args.autocast if args.parallelism == "fsdp" and self.device.type == "cuda" else None
        self.train_policy = distributed.shard(self.policy, args.parallelism, mixed)
        for frozen in (self.reference, self.teacher):
            if isinstance(frozen, torch.nn.Module) and args.parallelism == "fsdp":
                distributed.shard(frozen, "fsdp", mixed)
        critic = self.critic_module
        self.train_critic = distributed.shard(critic, args.parallelism, mixed) if critic is not None else None

    def autocast(self):
        """``torch.autocast`` when the config asks for mixed precision, else a no-op context."""
        if self.args.autocast is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=getattr(torch, self.args.autocast))

    @property
    def full_distillation(self) -> bool:
        """The update reads the policy's hidden states for the full-distribution divergence to the teacher."""
        return self.teacher is not None and self.args.distillation_mode == "full"

    @property
    def critic_module(self) -> torch.nn.Module | None:
        return self.critic if self.critic is not None else self.value_head

    def _forward(
        self, rollout: RolloutBatch, *, with_values: bool, with_entropy: bool = False, entropy_grad: bool = False
    ):
        with self.autocast():
            return self._forward_inner(
                rollout, with_values=with_values, with_entropy=with_entropy, entropy_grad=entropy_grad
            )

    def engine_support(self, rollout: RolloutBatch) -> tuple[int, float] | None:
        """``(top_k, top_p)`` when the rollout carries an engine's log-probs of a truncated sampler:
        the trainer then also returns ``log_kept_mass`` so the importance ratio compares the
        distribution the engine drew from (``algorithms.log_kept_mass``). None otherwise."""
        args = self.args
        truncates = args.top_k > 0 or args.top_p < 1.0
        return (args.top_k, args.top_p) if truncates and rollout.logprobs is not None else None

    def _forward_inner(self, rollout: RolloutBatch, *, with_values: bool, with_entropy: bool, entropy_grad: bool):
        out = self._pass(
            self.train_policy,
            rollout,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
            with_hidden=(with_values and self.value_head is not None) or self.full_distillation,
            support=self.engine_support(rollout),
        )
        values = None
        if with_values:
            critic = self.train_critic
            if critic is None:
                raise ValueError("values asked of RLModels without a critic (use_critic is off)")
            if self.value_head is not None:
                values = critic(out.hidden).squeeze(-1).float()
            else:
                values = rollout_values(critic, rollout)  # ScalarModel.values
        return out.logprobs, values, out.entropy, out.log_kept_mass, out.hidden

    @torch.no_grad()
    def policy_outputs(self, rollout: RolloutBatch, *, with_values: bool):
        """Old log-probs, values (``with_values``) and ``log_kept_mass`` (None unless
        ``engine_support``) before any update, in micro-batches (``micro_batches``)."""
        parts, order = self._in_micro_batches(rollout, lambda r: self._forward(r, with_values=with_values))
        cat = lambda i: self._in_order(torch.cat([p[i] for p in parts]), order) if parts[0][i] is not None else None  # noqa: E731
        return cat(0), cat(1), cat(3)

    def train_outputs(self, rollout: RolloutBatch, *, with_values: bool, entropy_grad: bool):
        """``(logprobs, values, entropy, log_kept_mass, hidden)`` of a micro-batch, with gradients; its layers
        checkpointed or not as the memory policy says (``plan_memory``). ``hidden`` (B, T, H): the last hidden
        states the output layer reads, with a value head or ``full_distillation``, else None."""
        if self.memory is None:
            return self._forward(rollout, with_values=with_values, with_entropy=True, entropy_grad=entropy_grad)
        rows, width = _extent(rollout)
        with self.memory.pass_context(rows, width):
            return self._forward(rollout, with_values=with_values, with_entropy=True, entropy_grad=entropy_grad)

    def plan_memory(self) -> MemoryPlan:
        """The activation policy of the update (``models.memory.MemoryPlan``): ``gradient_checkpointing``
        and ``memory_budget_gb``, with the activation cost of ``train_outputs`` measured first
        (``activations.measure_activation_cost``) when something plans with it ('auto' checkpointing, or
        ``max_tokens_per_micro_batch='auto'``). Called once the models are final (LoRA, head mode); every
        process calls it (the probe's backward is a collective under DDP and FSDP2)."""
        args = self.args
        trained = [m for m in (self.policy, self.critic_module) if m is not None]
        layers = [layer for m in trained for layer in checkpointable_layers(m)]
        cost = None
        if args.gradient_checkpointing == "auto" or args.max_tokens_per_micro_batch == "auto":
            cost = measure_activation_cost(
                self._probe, trained, layers, args.gradient_checkpointing != "off", decoder_layer_count(self.policy)
            )
        self.memory = MemoryPlan(args.gradient_checkpointing, cost, self.device, args.memory_budget_gb, layers, trained)
        return self.memory

    def _probe(self, n: int) -> torch.Tensor:
        """The update's forward pass on one synthetic row of ``n`` tokens (a one-token prompt): a scalar
        of its outputs, for ``measure_activation_cost``."""
        ids = probe_ids(self.policy, n, self.device)
        ones = torch.ones_like(ids)
        row = _ProbeRow(ids, ones, ones[:, 1:])
        logprobs, values, *_ = self._forward(row, with_values=bool(self.args.use_critic), with_entropy=True)
        return logprobs.sum() + (values.sum() if values is not None else 0)

    def token_budget(self, rollout: RolloutBatch) -> int | None:
        """The token budget of ``rollout``'s micro-batches (``micro_batches.token_budget`` of the config),
        capped, or set with ``max_tokens_per_micro_batch='auto'``, by what fits in memory
        (``MemoryPlan.token_budget``, at the rollout's widest row)."""
        args = self.args
        by_memory = args.max_tokens_per_micro_batch == "auto"
        configured = None if by_memory else token_budget(args.micro_batch_size, args.max_tokens_per_micro_batch)
        if self.memory is None:
            return configured
        lead, tail = row_spans(rollout.attention_mask, rollout.response_mask.shape[1])
        return self.memory.token_budget(configured, int((lead + tail).max()), by_memory)

    @torch.no_grad()
    def reference_logprobs(self, rollout: RolloutBatch) -> torch.Tensor:
        model = self.reference if self.reference is not None else self.train_policy
        adapter_off = self.policy.disable_adapter() if self.reference is None else nullcontext()
        with adapter_off, self.autocast():
            parts, order = self._in_micro_batches(rollout, lambda r: self._pass(model, r).logprobs)
            return self._in_order(torch.cat(parts), order)

    @torch.no_grad()
    def teacher_logprobs(self, rollout: RolloutBatch) -> torch.Tensor:
        """(B, T) the teacher's log-probs of the sampled tokens at the sampling temperature, in micro-batches; a
        served teacher's (``RemoteTeacher``) from its server, each process sending its own rows."""
        if isinstance(self.teacher, RemoteTeacher):
            return self.teacher.agreed_logprobs(rollout)
        with self.autocast():
            parts, order = self._in_micro_batches(rollout, lambda r: self._pass(self.teacher, r).logprobs)
            return self._in_order(torch.cat(parts), order)

    @torch.no_grad()
    def teacher_hidden(self, rollout: RolloutBatch) -> torch.Tensor:
        """(B, T, H) the teacher's last hidden states at the positions that predict the sampled tokens (what its
        output layer reads) for one micro-batch of the update."""
        with self.autocast():
            out = self._pass(self.teacher, rollout, with_hidden=True)
        if out.hidden is None:  # forward_rollout returns them when asked
            raise RuntimeError("the teacher's forward pass returned no hidden states")
        return out.hidden

    def _pass(self, model, rollout: RolloutBatch, **options) -> ResponseForward:
        """``forward_rollout`` of ``model`` on ``rollout``'s rows as every pass of the loop runs it: at the
        sampling temperature, each prompt's group packed with ``share_prompt``, the output layer read as
        ``args.lm_head`` says; ``options``: the pass's own (``policy.forward_response``'s keywords)."""
        # Packed groups are one forward pass per micro-batch, as unpacked rows are: under torchrun
        # every process still runs the same (collective) passes.
        args = self.args
        prompt_index = rollout.prompt_index if args.share_prompt else None
        return forward_rollout(
            model, rollout, args.temperature, prompt_index=prompt_index, lm_head=args.lm_head, **options
        )

    def micro_batches(self, rollout: RolloutBatch) -> list[torch.Tensor]:
        """The rows (CPU indices) of each micro-batch of the no-gradient passes: at most
        ``micro_batch_size`` rows and the token budget in force (``micro_batches.token_budget``),
        grouped by length, a prompt's group kept whole with ``share_prompt`` when it fits
        (``micro_batches.split_rows``); without a budget, consecutive slices of ``micro_batch_size``."""
        B, T = rollout.input_ids.shape[0], rollout.response_mask.shape[1]
        budget = self.token_budget(rollout)
        if budget is None:
            return split_rows(torch.arange(B), None, None, max_rows=self.args.micro_batch_size)
        lead, tail = row_spans(rollout.attention_mask, T)
        return split_rows(
            torch.arange(B),
            lead,
            tail,
            max_rows=self.args.micro_batch_size,
            max_tokens=budget,
            groups=rollout.prompt_index if self.args.share_prompt else None,
            prompt_region=rollout.input_ids.shape[1] > T,
        )

    def _in_micro_batches(self, rollout: RolloutBatch, run) -> tuple[list, torch.Tensor | None]:
        """``run`` on each micro-batch's rows; returns its results and the rows they cover, in
        order (None: the batch's own order). Under a token budget the number of micro-batches can
        differ between processes: a process with fewer runs filler passes (one row, result
        dropped), so every process runs the same (collective) forward passes."""
        chunks = self.micro_batches(rollout)
        # the count is agreed before any pass: a pass is a collective under FSDP2, the all-reduce one too
        n = distributed.reduce_max(len(chunks))
        parts = [run(rollout.select(rows.to(self.device))) for rows in chunks]
        for _ in range(n - len(chunks)):
            run(rollout.select(torch.zeros(1, dtype=torch.long, device=self.device)))
        order = torch.cat(chunks)
        return parts, None if bool((order == torch.arange(len(order))).all()) else order

    @staticmethod
    def _in_order(x: torch.Tensor, order: torch.Tensor | None) -> torch.Tensor:
        """Rows ``x`` laid out as ``order`` (the micro-batches' rows, in turn) back in the batch's order."""
        if order is None:
            return x
        return x.new_empty(x.shape).index_copy_(0, order.to(x.device), x)

    def save_policy(self, path: Path, tokenizer=None) -> None:
        """The policy as a Hugging Face directory (LoRA: merged, or the adapter alone with
        ``save_adapter``), written by the main process from the gathered full weights; every
        process must call this."""
        export_causal_lm(self.policy, path, tokenizer, self.args.save_adapter, self._peft_template)


def resolve_device(device: str) -> torch.device:
    """'auto' → the GPU when torch sees one, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


class _ProbeRow:
    """One synthetic rollout row for the memory probe (``RolloutBatch``'s fields)."""

    def __init__(self, input_ids, attention_mask, response_mask):
        self.input_ids, self.attention_mask, self.response_mask = input_ids, attention_mask, response_mask
        self.prompt_index = self.logprobs = None

    def select(self, rows):
        return self


def _extent(rollout: RolloutBatch) -> tuple[int, int]:
    """``(rows, width)`` of the padded forward pass over a micro-batch (``micro_batches.padded_tokens``)."""
    B, T = rollout.input_ids.shape[0], rollout.response_mask.shape[1]
    lead, tail = row_spans(rollout.attention_mask, T)
    tokens = padded_tokens(lead, tail, torch.arange(B), rollout.input_ids.shape[1] > T)
    return B, max(tokens // max(B, 1), 1)


def _base_causal_lm(policy):
    return policy.get_base_model() if hasattr(policy, "get_base_model") else policy
