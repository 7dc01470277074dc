"""Scoring a policy on a prompt set: sample completions, score them with reward functions and/or
reward models, and measure the KL to a reference model (the quantities of an RLHF before/after
table)."""

from __future__ import annotations

import numbers
from contextlib import contextmanager

import torch

from .. import distributed
from ..agents.agent import Agent
from ..agents.episode import AgentOptions
from ..algorithms import kl_penalty, masked_sum
from ..data import load_prompt_dataset
from ..data.chat_templates import use_chat_template
from ..data.encode import prompt_limit, tokenize_prompts
from ..models import freeze, load_causal_lm, load_tokenizer
from ..models.loading import eos_token_ids
from ..models.rl_models import resolve_device
from ..models.segments import forward_rollout
from ..rewards.sources import build_rewards
from ..rollout import HFEngine, SamplingParams
from .score import reward_call

# A prompt's completions are generated in one batch, so their number bounds the memory one
# generation needs; more samples of a prompt set: evaluate again (sampling draws anew each time).
MAX_SAMPLES_PER_PROMPT = 1024
MAX_BATCH_SIZE = 1_000_000


def check_eval_sizes(samples_per_prompt, batch_size, names=("samples_per_prompt", "batch_size")) -> None:
    """One line naming the argument (``names``: how the caller calls them, e.g. the CLI's flags)
    for a sample count outside [1, ``MAX_SAMPLES_PER_PROMPT``] or a batch size outside [1, ``MAX_BATCH_SIZE``]."""
    for value, name, high in (
        (samples_per_prompt, names[0], MAX_SAMPLES_PER_PROMPT),
        (batch_size, names[1], MAX_BATCH_SIZE),
    ):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 1 <= int(value) <= high:
            why = " (a prompt's completions are generated together)" if high == MAX_SAMPLES_PER_PROMPT else ""
            raise ValueError(f"{name} must be an integer in [1, {high}]{why}, got {value!r}")


@torch.no_grad()
def evaluate_policy(
    model,
    reward_funcs,
    dataset,
    tokenizer=None,
    reference=None,
    samples_per_prompt: int = 1,
    sampling: SamplingParams | None = None,
    batch_size: int = 64,
    reward_weights=None,
    device: str = "auto",
    tools=None,
    environment_factory=None,
    chat_template: str | None = None,
    max_tool_calling_iterations: int = 8,
) -> dict:
    """Returns ``{"metrics": {...}, "samples": [{prompt, completion, score}, ...]}`` (a sample also holds
    the columns the reward functions passed to ``log_extra``; the functions get TRL's contract, as
    in training, with ``trainer_state=None``: no run).

    Metrics: ``eval/<source>_mean`` per reward source, ``eval/score_mean`` (weighted total),
    ``eval/kl_to_reference`` (k1 summed over each completion's tokens, averaged — the sequence KL),
    ``eval/response_length_mean`` and ``eval/truncated_frac``.

    ``tools`` / ``environment_factory`` (as ``RLTrainer``'s): each sample is an agent episode of
    at most ``max_tool_calling_iterations`` tool rounds within ``max_new_tokens`` (see
    ``rlhfkit.agents.episode``), scored on its conversation; ``chat_template`` (a file, inline
    Jinja or a shipped name such as ``chatml_tools``) replaces the tokenizer's.
    """
    check_eval_sizes(samples_per_prompt, batch_size)
    distributed.check_device(device)
    rows = load_prompt_dataset(dataset, name="eval dataset")  # data errors before any model load
    tokenizer = load_tokenizer(
        tokenizer if tokenizer is not None else model, "model" if tokenizer is None else "tokenizer"
    )
    use_chat_template(tokenizer, chat_template)
    policy, ref = _load(model, device), _load(reference, device) if reference is not None else None
    rewards = build_rewards(reward_funcs, reward_weights, tokenizer, next(policy.parameters()).device)
    limit = prompt_limit(None, (sampling or SamplingParams()).max_new_tokens, getattr(policy, "config", None))
    agent, prompt_ids = None, None
    if tools or environment_factory is not None:
        options = AgentOptions(
            max_tool_calling_iterations=max_tool_calling_iterations,
            model_name=str(model) if isinstance(model, str) else "model",
        )
        agent = Agent(
            tokenizer, list(tools or []), environment_factory, options, limit, eos_ids=eos_token_ids(tokenizer, policy)
        )
    else:
        prompt_ids = tokenize_prompts(rows, tokenizer, limit, name="eval dataset")  # too long: refused, naming the row
    with _eval_mode(policy, ref):
        return run_evaluation(
            policy,
            ref,
            tokenizer,
            rewards,
            rows,
            prompt_ids,
            samples_per_prompt,
            sampling or SamplingParams(),
            batch_size,
            agent=agent,
        )


@contextmanager
def _eval_mode(*models):
    """Eval mode for the duration (no dropout), then each model's own mode back."""
    present = [m for m in models if m is not None]
    modes = [m.training for m in present]
    for m in present:
        m.eval()
    try:
        yield
    finally:
        for m, mode in zip(present, modes):
            m.train(mode)


def run_evaluation(
    policy,
    ref,
    tokenizer,
    rewards,
    rows,
    prompt_ids,
    samples_per_prompt,
    sampling,
    batch_size,
    engine=None,
    agent=None,
    trainer_state=None,
    version: int = 0,
) -> dict:
    """``evaluate_policy`` on models, reward sources and tokenized prompts already set up (the RL
    trainer's periodic evaluation calls it with its live policy and its engine, ready to generate
    from it). ``engine`` None: HF generate on ``policy``.

    ``agent`` (an ``rlhfkit.agents.source.EpisodeSource``, as ``rlhfkit.agents.agent.Agent``):
    each sample is a multi-turn episode (``version``: the weights', told to the agent) with the
    agent's tools and a fresh environment per sample, scored as in training (the conversation as
    the completion, ``environments=`` to the reward functions); ``eval/turns_mean`` and
    ``eval/tool_calls_mean`` are added. ``prompt_ids`` is then unused: the agent renders each row
    with the tools' schemas.

    The reward functions are called as in training (``rl.score.reward_call``: TRL's contract, with
    ``trainer_state``: the trainer's ``TrainingState``, None from ``evaluate_policy``); what they
    pass to ``log_metric`` is averaged over the set as ``eval/<name>``, what they pass to
    ``log_extra`` joins each sample's dict."""
    engine = engine or HFEngine(policy, tokenizer.pad_token_id, tokenizer.eos_token_id)
    logged: dict[str, list] = {}
    per_source: dict[str, list] = {}
    totals, kls, lengths, truncated, samples, turns, calls = [], [], [], [], [], [], []
    step = max(1, batch_size // samples_per_prompt)
    for start in range(0, len(rows), step):
        batch = rows[start : start + step]
        data = [r for r in batch for _ in range(samples_per_prompt)]
        episodes = None
        if agent is None:
            rollout = engine.generate(prompt_ids[start : start + step], samples_per_prompt, sampling)
        else:
            episodes = agent.start(rows, range(start, start + len(batch)), samples_per_prompt, name="eval_dataset")
            rollout, episodes = agent.run(engine, episodes, sampling, version=version)
            turns += [e.turns for e in episodes]
            calls += [e.tool_calls for e in episodes]
        out, completions = reward_call(rewards, data, rollout, tokenizer, episodes, trainer_state)
        for name, values in out.metrics.items():
            logged.setdefault(name, []).extend(values)
        for name, values in out.per_function.items():
            per_source.setdefault(name, []).append(values)
        totals.append(out.scores)
        lengths.append(rollout.response_mask.sum(-1).float())
        truncated.append((~rollout.has_eos).float())
        if ref is not None:
            lp = forward_rollout(policy, rollout, sampling.temperature).logprobs  # agent segments: each in its context
            lq = forward_rollout(ref, rollout, sampling.temperature).logprobs
            kls.append(masked_sum(kl_penalty(lp, lq, "k1"), rollout.response_mask.bool(), dim=-1))
        samples += [
            {**{k: v[i] for k, v in out.extra.items()}, "prompt": d["prompt"], "completion": c, "score": float(s)}
            for i, (d, c, s) in enumerate(zip(data, completions, out.scores))
        ]
    metrics = {f"eval/{k}_mean": float(torch.nanmean(torch.cat(v))) for k, v in per_source.items()}
    metrics["eval/score_mean"] = float(torch.cat(totals).mean())
    metrics["eval/response_length_mean"] = float(torch.cat(lengths).mean())
    metrics["eval/truncated_frac"] = float(torch.cat(truncated).mean())
    if kls:
        metrics["eval/kl_to_reference"] = float(torch.cat(kls).mean())
    if agent is not None:
        metrics["eval/turns_mean"] = sum(turns) / len(turns)
        metrics["eval/tool_calls_mean"] = sum(calls) / len(calls)
    metrics.update({f"eval/{name}": sum(values) / len(values) for name, values in logged.items()})
    return {"metrics": metrics, "samples": samples}


def _load(model, device: str):
    """A model directory is loaded frozen onto ``device``; a model object is used as it is (only
    switched to eval mode for the duration, never frozen: it may be the caller's live policy)."""
    if isinstance(model, torch.nn.Module):
        return model
    return freeze(load_causal_lm(model, "float32")).to(resolve_device(device))
