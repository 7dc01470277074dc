"""Multi-turn agent episodes, token in and token out, on any ``RolloutEngine``.

An episode starts from its prompt's ids (the conversation and the tools' schemas rendered by the
chat template, after the environment's ``reset``). Each turn the engine continues the *exact ids
so far* — prompt, every sampled token, every appended tool suffix — never a re-rendering. A turn
ends at the EOS token (the template's end of turn). Its text is decoded only to read tool calls
(``parse_tool_calls``); each episode's calls run in the order written, the episodes' side by side
(``calls.run_tool_calls``), and their results are appended as the template's tool-message suffix
(``templates.tool_suffix``), tokenised once. An episode ends when a turn makes no tool call, a
tool call is malformed or times out (``calls``: its environment is never read again),
``max_tool_calling_iterations`` tool rounds have run, or its budget is spent.

The budget: an episode's response region — every sampled token and every appended tool suffix —
holds at most ``max_new_tokens`` tokens. Each turn may sample what is left; a tool suffix that
would leave no token for the next turn is not appended — nor are its tool messages: the
conversation the reward functions and ``samples.jsonl`` see is the one the model saw — and the
episode ends truncated. A truncated episode has no EOS for the trainer (``Rollout.has_eos`` False:
``mask_truncated_completions`` and the missing-EOS penalty take it as cut) and its ``length``,
what the overlong penalty reads, is the whole budget, as for a single completion cut at
``max_new_tokens``; any other episode's ``length`` is its response region. A tool result longer
than ``max_tool_response_tokens`` is cut to that many tokens and marked ``[truncated]``.

The trainer trains on the sampled tokens only: ``Rollout.response_mask`` is 1 on them and 0 on
tool suffixes (tool output and template glue), while ``attention_mask`` covers every real token;
the engine's log-probs (vLLM) sit at the sampled positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from ..rollout.base import Rollout, SamplingParams, Seed, row_seeds, sampling_seed
from ..data.padding import pad
from .parsing import MalformedToolCall, parse_tool_calls
from .templates import encode, prompt_ids, tool_suffix_ids
from .calls import run_tool_calls
from .tools import Tool

TRUNCATION_MARK = " [truncated]"


@dataclass
class Episode:
    """One rollout of an agent: its prompt, its response region and the conversation it produced."""

    prompt_ids: list[int]
    tools: dict[str, Tool]
    environment: object | None = None
    ids: list[int] = field(default_factory=list)  # the response region: sampled tokens and tool suffixes
    sampled: list[bool] = field(default_factory=list)  # True where the policy sampled the token
    logprobs: list[float] = field(default_factory=list)  # the engine's, 0.0 on tool suffixes
    messages: list[dict] = field(default_factory=list)  # the generated assistant and tool messages
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    has_eos: bool = False  # the last turn ended with the EOS token
    truncated: bool = False  # the budget (max_new_tokens) ended it
    timed_out: bool = False  # a tool call timed out: the environment is never read again
    length: int = 0  # what the budget counted (max_new_tokens when it ended the episode): the overlong penalty's
    done: bool = False

    @property
    def schemas(self) -> list[dict] | None:
        return [t.schema for t in self.tools.values()] or None


@dataclass(frozen=True)
class AgentOptions:
    """How episodes run (``RLConfig``'s agent fields)."""

    max_tool_calling_iterations: int = 8
    max_tool_response_tokens: int | None = 256
    tool_call_timeout: float = 30.0
    model_name: str = "model"


def start_episode(tokenizer, messages: list[dict], tools: dict[str, Tool], environment=None) -> Episode:
    """An episode of ``messages`` (the prompt conversation) with ``tools``."""
    schemas = [t.schema for t in tools.values()] or None
    return Episode(prompt_ids(tokenizer, messages, schemas), tools, environment)


def run_episodes(engine, tokenizer, episodes: list[Episode], sampling: SamplingParams, options: AgentOptions,
                 seed: Seed = None) -> Rollout:
    """Run ``episodes`` to their end with ``engine`` and return them as one ``Rollout`` (rows in
    the order of ``episodes``, ``prompt_index`` None: episodes do not share a prompt pass).

    ``seed``: one per episode (or an int ``s``: episode ``i`` gets ``s + i``; None: the engine's
    stream). An episode's first turn samples with its seed, turn ``t`` with ``sampling_seed(seed,
    t)``: its tokens never depend on which other episodes are still running."""
    budget, eos = sampling.max_new_tokens, tokenizer.eos_token_id
    seeds = row_seeds(seed, len(episodes), 1)
    with_logprobs = True
    for turn in range(options.max_tool_calling_iterations + 1):
        active = [k for k, e in enumerate(episodes) if not e.done]
        if not active:
            break
        turn_seeds = None if seeds is None else [seeds[k] if turn == 0 else sampling_seed(seeds[k], turn)
                                                 for k in active]
        active = [episodes[k] for k in active]
        left = max(budget - len(e.ids) for e in active)
        out = engine.generate([e.prompt_ids + e.ids for e in active], 1, replace(sampling, max_new_tokens=left),
                              seed=turn_seeds)
        with_logprobs = out.logprobs is not None
        pending = []
        for i, e in enumerate(active):
            new, logprobs = _turn_tokens(out, i, budget - len(e.ids))
            e.ids += new
            e.sampled += [True] * len(new)
            e.logprobs += logprobs
            e.turns += 1
            e.has_eos = bool(new) and new[-1] == eos
            text = tokenizer.decode(new[:-1] if e.has_eos else new, skip_special_tokens=False)
            if not e.has_eos:  # out of budget mid-turn
                e.messages.append({"role": "assistant", "content": text})
                e.truncated = e.done = True
                continue
            try:
                content, calls = parse_tool_calls(text, tokenizer, e.schemas)
            except MalformedToolCall:
                e.messages.append({"role": "assistant", "content": text})
                e.tool_errors += 1
                e.done = True
                continue
            e.messages.append({"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})})
            if not calls or turn == options.max_tool_calling_iterations:
                e.done = True
                continue
            e.tool_calls += len(calls)
            pending.append((e, [call["function"] for call in calls]))
        _answer_tool_calls(tokenizer, pending, budget, options)
    for e in episodes:
        e.length = budget if e.truncated else len(e.ids)
    return episodes_rollout(episodes, tokenizer.pad_token_id, with_logprobs)


def _turn_tokens(out: Rollout, row: int, room: int) -> tuple[list[int], list[float]]:
    """The ids the engine sampled for ``row`` up to and including its EOS, at most ``room``."""
    n = int(out.response_mask[row].sum())
    ids = out.response_ids[row, :n].tolist()[:room]
    logprobs = out.logprobs[row, :n].tolist()[:room] if out.logprobs is not None else [0.0] * len(ids)
    return ids, logprobs


def _answer_tool_calls(tokenizer, pending: list, budget: int, options: AgentOptions) -> None:
    """Run the pending calls (``(episode, [function, ...])``: each episode's in order, the episodes
    side by side), then append each episode's tool messages and suffix — or, when the suffix
    leaves no room for another token, neither: the episode ends truncated."""
    results = run_tool_calls([[(e.tools, f["name"], f["arguments"]) for f in fs] for e, fs in pending],
                             options.tool_call_timeout)
    for (e, fs), answers in zip(pending, results):
        e.tool_errors += sum(a.failed for a in answers)
        if any(a.timed_out for a in answers):  # its environment may still change: the episode ends here
            e.timed_out = e.done = True
        tool_messages = [{"role": "tool", "name": f["name"], "content": _cut(tokenizer, a.text, options)}
                         for f, a in zip(fs, answers)]
        suffix = tool_suffix_ids(tokenizer, tool_messages, e.schemas, options.model_name)
        if len(e.ids) + len(suffix) >= budget:  # no room left to answer: the episode ends here, unanswered
            e.truncated = e.done = True
            continue
        e.messages += tool_messages
        e.ids += suffix
        e.sampled += [False] * len(suffix)
        e.logprobs += [0.0] * len(suffix)


def _cut(tokenizer, text: str, options: AgentOptions) -> str:
    limit = options.max_tool_response_tokens
    ids = encode(tokenizer, text)
    if limit is None or len(ids) <= limit:
        return text
    return tokenizer.decode(ids[:limit]) + TRUNCATION_MARK


def episodes_rollout(episodes: list[Episode], pad_id: int, with_logprobs: bool = True) -> Rollout:
    """The episodes as one batch: prompts left-padded, response regions right-padded;
    ``response_mask`` on the sampled tokens, ``attention_mask`` on every real token, ``has_eos``
    from the last turn (False for an episode the budget ended), ``logprobs`` the engine's (None
    when it reports none: the HF engine)."""
    prompts, prompt_mask = pad([e.prompt_ids for e in episodes], pad_id, "left")
    ids, real = pad([e.ids for e in episodes], pad_id, min_width=1)
    sampled = pad([[int(s) for s in e.sampled] for e in episodes], 0, min_width=1)[0]
    logprobs = torch.zeros(sampled.shape, dtype=torch.float32)
    for i, e in enumerate(episodes):
        logprobs[i, :len(e.logprobs)] = torch.tensor(e.logprobs, dtype=torch.float32)
    has_eos = torch.tensor([e.has_eos and not e.truncated for e in episodes], dtype=torch.bool)
    return Rollout(torch.cat([prompts, ids], 1), torch.cat([prompt_mask, real], 1), sampled.long(), has_eos,
                   prompts.shape[1], None, logprobs if with_logprobs else None)
