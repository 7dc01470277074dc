"""Set-up of the RL loop's models, reward sources and prompts.

``Models`` holds the policy, the critic (a separate ``ScalarModel`` or a value head on the
policy's backbone) and the reference (a frozen copy, or the policy with its LoRA adapter disabled),
and exposes the three forward passes the loop needs.
"""

from __future__ import annotations

import copy
import os
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

from .. import distributed
from ..config import RLConfig
from ..data import render_prompt
from ..data.encode import encode_pair, note_unknown
from ..models import (
    ScalarModel, disable_dropout, enable_activation_checkpointing, forward_response, freeze, load_causal_lm, load_tokenizer,
)
from ..rewards import RewardFunctions, get_reward_function
from ..rewards.reward_model import RewardModelFunction
from ..models.lora import export_causal_lm, unsharded_template
from ..rollout import HFEngine, Rollout


class Models:
    def __init__(self, policy, tokenizer, args: RLConfig, ref_model=None):
        self.policy, self.tokenizer, self.args = policy, tokenizer, args
        self.device = next(policy.parameters()).device
        self.is_peft = hasattr(policy, "disable_adapter") and hasattr(policy, "peft_config")
        self.reference = None
        if args.kl_coef > 0 and (ref_model is not None or not self.is_peft):
            ref = ref_model if ref_model is not None else copy.deepcopy(policy)
            self.reference = freeze(load_causal_lm(ref, args.dtype if ref_model is not None else None)).to(self.device)
        self.critic = self.value_head = None
        if args.use_critic and args.critic == "shared":
            hidden = policy.config.hidden_size
            # Zero init: every value starts at 0, so the first advantages are the plain returns.
            self.value_head = torch.nn.Linear(hidden, 1).to(self.device, next(policy.parameters()).dtype)
            torch.nn.init.zeros_(self.value_head.weight)
            torch.nn.init.zeros_(self.value_head.bias)
        elif args.use_critic:
            self.critic = (ScalarModel.from_pretrained(args.critic_init, args.dtype) if args.critic_init
                           else ScalarModel.from_causal_lm(_base_causal_lm(policy))).to(self.device)
        self._shard()

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
        if self.reference is not None and args.parallelism == "fsdp":
            distributed.shard(self.reference, "fsdp", mixed)
        critic = self.critic_module
        self.train_critic = distributed.shard(critic, args.parallelism, mixed) if critic is not None else None

    def autocast(self):
        """``torch.autocast`` when the config asks for mixed precision, else a no-op context."""
        if self.args.autocast is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=getattr(torch, self.args.autocast))

    @property
    def critic_module(self) -> torch.nn.Module | None:
        return self.critic if self.critic is not None else self.value_head

    def _forward(self, rollout: Rollout, with_values: bool, with_entropy: bool, entropy_grad: bool):
        with self.autocast():
            return self._forward_inner(rollout, with_values, with_entropy, entropy_grad)

    def engine_support(self, rollout: Rollout) -> tuple[int, float] | None:
        """``(top_k, top_p)`` when the rollout carries an engine's log-probs of a truncated sampler:
        the trainer then also returns ``log_kept_mass`` so the importance ratio compares the
        distribution the engine drew from (``algorithms.log_kept_mass``). None otherwise."""
        args = self.args
        truncates = args.top_k > 0 or args.top_p < 1.0
        return (args.top_k, args.top_p) if truncates and rollout.logprobs is not None else None

    def _forward_inner(self, rollout: Rollout, with_values: bool, with_entropy: bool, entropy_grad: bool):
        T = rollout.response_mask.shape[1]
        out = forward_response(self.train_policy, rollout.input_ids, rollout.attention_mask, T, self.args.temperature,
                               with_entropy=with_entropy, entropy_grad=entropy_grad,
                               with_hidden=with_values and self.value_head is not None,
                               prompt_index=self._prompt_index(rollout), support=self.engine_support(rollout))
        values = None
        if with_values and self.value_head is not None:
            values = self.train_critic(out.hidden).squeeze(-1).float()
        elif with_values:
            values = self.train_critic(rollout.input_ids, rollout.attention_mask, T)  # ScalarModel.values
        return out.logprobs, values, out.entropy, out.log_kept_mass

    @torch.no_grad()
    def policy_outputs(self, rollout: Rollout, with_values: bool):
        """Old log-probs, values (``with_values``) and ``log_kept_mass`` (None unless
        ``engine_support``) before any update, in micro-batches."""
        parts = [self._forward(r, with_values, False, False) for r in self._chunks(rollout)]
        cat = lambda i: torch.cat([p[i] for p in parts]) if parts[0][i] is not None else None  # noqa: E731
        return cat(0), cat(1), cat(3)

    def train_outputs(self, rollout: Rollout, with_values: bool, entropy_grad: bool):
        """``(logprobs, values, entropy, log_kept_mass)`` of a micro-batch, with gradients."""
        return self._forward(rollout, with_values, True, entropy_grad)

    @torch.no_grad()
    def reference_logprobs(self, rollout: Rollout) -> torch.Tensor:
        model = self.reference if self.reference is not None else self.train_policy
        adapter_off = self.policy.disable_adapter() if self.reference is None else nullcontext()
        T = rollout.response_mask.shape[1]
        with adapter_off, self.autocast():
            return torch.cat([forward_response(model, r.input_ids, r.attention_mask, T, self.args.temperature,
                                               prompt_index=self._prompt_index(r)).logprobs
                              for r in self._chunks(rollout)])

    def _prompt_index(self, rollout: Rollout) -> torch.Tensor | None:
        # Under torchrun a sharded model's forward passes are collectives, and a shared prompt pass
        # adds one where a micro-batch repeats a prompt: every process must run the same passes, so
        # only generation (with gathered weights) shares the prompt there.
        return rollout.prompt_index if self.args.share_prompt and distributed.world() == 1 else None

    def _chunks(self, rollout: Rollout):
        size = self.args.micro_batch_size or rollout.input_ids.shape[0]
        for rows in torch.arange(rollout.input_ids.shape[0], device=self.device).split(size):
            yield rollout.select(rows)

    def save_policy(self, path: Path, tokenizer=None) -> None:
        """The policy as a Hugging Face directory (LoRA: merged, or the adapter alone with
        ``save_adapter``), written by the main process from the gathered full weights; every
        process must call this."""
        export_causal_lm(self.policy, path, tokenizer, self.args.save_adapter, self._peft_template)


def build_engine(args: RLConfig, models: Models, prompt_ids: list[list[int]]):
    """The rollout engine ``args.rollout_engine`` names: HF generate on the policy, or a vLLM engine
    in this process sized for the longest prompt plus the longest completion the run asks for."""
    tokenizer = models.tokenizer
    if args.rollout_engine == "hf":
        return HFEngine(models.policy, tokenizer.pad_token_id, tokenizer.eos_token_id, args.share_prompt)
    from ..rollout.vllm import VLLMEngine
    from ..rollout.weight_sync import check_engine_weights

    check_engine_weights(models.policy)  # an adapter the engine cannot receive merged: one line, before training
    longest = max((len(p) for p in prompt_ids), default=1)
    new_tokens = max(args.max_new_tokens, args.eval_max_new_tokens or 0)
    return VLLMEngine(models.policy, tokenizer, max_model_len=longest + new_tokens + 1,
                      seed=args.seed + 1_000_003 * distributed.rank(), kv_cache_gb=args.vllm_kv_cache_gb,
                      gpu_memory_utilization=args.vllm_gpu_memory_utilization, enforce_eager=args.vllm_enforce_eager,
                      sleep=args.vllm_sleep, tensor_parallel_size=args.vllm_tensor_parallel_size,
                      multiprocess=distributed.world() > 1)


@contextmanager
def engine_ready(engine, models: Models, version: int, timings: dict):
    """The engine ready to generate from the current policy. The HF engine generates with the
    policy itself (its parameters gathered under FSDP2); a vLLM engine first receives the weights
    when an update changed them since its last sync (``version``: optimizer steps so far). Every
    process syncs at this point of the loop, gathering the way HF generation does, so no process
    waits on a collective another never enters; the sync is timed as ``timings["weight_sync"]``."""
    if not getattr(engine, "needs_sync", False):
        with models.autocast(), distributed.gathered(models.policy):
            yield
        return
    if engine.synced_version != version:
        from ..rollout.weight_sync import hf_weights

        start = time.perf_counter()
        with torch.no_grad(), distributed.gathered(models.policy):
            engine.sync_weights(hf_weights(models.policy), version)
        timings["weight_sync"] = time.perf_counter() - start
    yield


def resolve_device(device: str) -> torch.device:
    """'auto' → the GPU when torch sees one, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _base_causal_lm(policy):
    return policy.get_base_model() if hasattr(policy, "get_base_model") else policy


def build_models(model, processing_class, args: RLConfig, peft_config=None, ref_model=None) -> Models:
    if processing_class is None and not isinstance(model, (str, os.PathLike)):
        raise ValueError("processing_class (the tokenizer) is required when model is an object, not a path")
    distributed.check_device(args.device)  # before anything loads
    tokenizer = load_tokenizer(processing_class if processing_class is not None else model,
                               "model" if processing_class is None else "processing_class")
    policy = load_causal_lm(model, args.dtype if isinstance(model, (str, os.PathLike)) else None)
    # The process group starts here, after every check that could fail the same way on every rank.
    policy = policy.to(distributed.setup(args.device))
    if peft_config is not None:
        from peft import get_peft_model

        policy = disable_dropout(get_peft_model(policy, peft_config))
    if args.gradient_checkpointing:
        enable_activation_checkpointing(policy)
        if peft_config is not None:
            policy.enable_input_require_grads()
    # Train mode (dropout is off, so forward passes are unchanged): activation checkpointing needs it.
    policy.train()
    return Models(policy, tokenizer, args, ref_model)


def build_rewards(reward_funcs, reward_weights, tokenizer, device=None) -> RewardFunctions:
    """Reward sources: callables, registered names / import paths, reward-model directories or
    ``ScalarModel`` objects (scored with their own tokenizer, or the policy's for objects)."""
    if reward_funcs is None:
        raise ValueError("reward_funcs is required: reward functions and/or reward-model directories")
    funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    resolved, names = [], []
    for i, spec in enumerate(funcs):
        if isinstance(spec, ScalarModel):
            fn = RewardModelFunction(freeze(spec), tokenizer, encode=encode_pair, name=f"reward_model_{i}")
        elif isinstance(spec, (str, os.PathLike)) and Path(spec).is_dir():
            rm = freeze(ScalarModel.from_pretrained(spec)).to(device or "cpu")
            name = Path(spec).name if Path(spec).name != "final" else Path(spec).parent.name  # run/final -> run
            fn = RewardModelFunction(rm, load_tokenizer(spec, "reward model"), encode=encode_pair, name=name)
        else:
            fn = get_reward_function(spec)
        resolved.append(fn)
        if isinstance(spec, str) and not isinstance(fn, RewardModelFunction):  # the name the user wrote
            names.append(spec.replace(":", ".").rsplit(".", 1)[-1])
        else:
            names.append(getattr(fn, "__name__", None) or type(fn).__name__)
    return RewardFunctions(resolved, reward_weights, names)


def prompt_limit(max_prompt_length: int | None, max_new_tokens: int, model_config) -> int | None:
    """The prompt-length limit in tokens: ``max_prompt_length`` when set, else what the model can
    take — its ``max_position_embeddings`` minus ``max_new_tokens`` (None when the config has no
    such bound)."""
    if max_prompt_length is not None:
        return max_prompt_length
    positions = getattr(model_config, "max_position_embeddings", None) if model_config is not None else None
    if not isinstance(positions, int):
        return None
    if positions <= max_new_tokens:
        raise ValueError(f"max_new_tokens={max_new_tokens} leaves no room for a prompt: the model takes "
                         f"{positions} positions (max_position_embeddings)")
    return positions - max_new_tokens


def tokenize_prompts(rows: list[dict], tokenizer, limit: int | None, truncate: str | None = None,
                     name: str = "train_dataset") -> list[list[int]]:
    """Each row's prompt rendered (chat template) and tokenised once. A prompt longer than
    ``limit`` tokens (``prompt_limit``) is refused in one line naming its row, or, with
    ``truncate='left'`` (``truncate_prompts``), loses its start, keeping the end next to the
    response."""
    ids = []
    for i, row in enumerate(rows):
        tokens = tokenizer(render_prompt(row["prompt"], tokenizer), add_special_tokens=False)["input_ids"]
        if limit is not None and len(tokens) > limit:
            if truncate != "left":
                raise ValueError(f"{name}: row index {i} (0-based): the prompt is {len(tokens)} tokens, longer than "
                                 f"{limit} (max_prompt_length, by default the model's positions minus "
                                 "max_new_tokens); set truncate_prompts=left to keep its last tokens, or shorten it")
            tokens = tokens[-limit:]
        ids.append(tokens)
    note_unknown(name, ids, tokenizer, "prompts")
    return ids
