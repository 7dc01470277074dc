"""Multi-turn agent episodes, token in and token out, on any ``RolloutEngine``.

An episode starts from its prompt's ids (the conversation and the tools' schemas rendered by the
chat template, after the environment's ``reset``). A turn ends where the engine ends a completion:
at any of the model's end ids (``models.loading.eos_token_ids``: the tokenizer's EOS, or the
template's end of turn when the model's generation config names it, as Gemma 2's
``<end_of_turn>``). Its text is decoded only to read tool calls (``parse_tool_calls``); each
episode's calls run in the order written, the episodes' side by side (``calls.run_tool_calls``).
An episode ends when a turn makes no tool call, a tool call is malformed or times out (``calls``:
its environment is never read again), ``max_tool_calling_iterations`` tool rounds have run, or its
budget is spent.

What the next turn continues depends on the chat template (``templates.rewrites_history``):

- a prefix-preserving template: the *exact ids so far* — prompt, every sampled token, every
  appended tool suffix — never a re-rendering; the tool results are appended as the template's
  tool-message suffix (``templates.tool_suffix``), tokenised once;
- a template that rewrites history (Qwen3's drops earlier turns' ``<think>``): the template's own
  rendering of the conversation so far (``templates.prompt_ids``), exactly as the model sees it at
  inference. When that rendering starts with the current context (the tokens the last turn was
  sampled after, and the turn), its new tokens are appended; else the history was rewritten and a
  new *segment* starts: the whole rendering, then the next turn. Every sampled token thus lies in
  exactly one segment, after exactly the tokens it was sampled after.

The budget: an episode's response region as the model sees it — every sampled token and every
tool suffix, i.e. the current context after the prompt (``Episode.used``) — holds at most
``max_new_tokens`` tokens. Each turn may sample what is left; tool results that would leave no
token for the next turn are not appended — nor are their tool messages: the conversation the
reward functions and ``samples.jsonl`` see is the one the model saw — and the episode ends
truncated. A truncated episode has no EOS for the trainer (``Rollout.has_eos`` False:
``mask_truncated_completions`` and the missing-EOS penalty take it as cut) and its ``length``,
what the overlong penalty reads, is the whole budget, as for a single completion cut at
``max_new_tokens``; any other episode's ``length`` is what the budget counted. A tool result longer
than ``max_tool_response_tokens`` is cut to that many tokens and marked ``[truncated]``.

The training rows: ``agents.rows``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..config.parts import ConfigFields, takes
from ..models.loading import eos_token_ids
from ..rollout.base import Rollout, SamplingParams, Seed, row_seeds, sampling_seed
from .calls import run_tool_calls
from .parsing import MalformedToolCall, parse_tool_calls
from .rows import episodes_rollout
from .templates import encode, prompt_ids, rewrites_history, tool_suffix_ids
from .tools import Tool

TRUNCATION_MARK = " [truncated]"


@dataclass
class Episode:
    """One rollout of an agent: its prompt, its response region and the conversation it produced.

    The response region ``ids`` holds, in order, every sampled token and every token of the
    contexts between turns (tool suffixes; with a template that rewrites history, also the whole
    re-rendering that starts a new segment); ``segment[j]`` is the segment of ``ids[j]`` (0: the
    one the prompt starts), ``start`` where the current segment starts in ``prompt_ids + ids``."""

    prompt_ids: list[int]
    tools: dict[str, Tool]
    environment: object | None = None
    prompt_messages: list[dict] = field(default_factory=list)  # the prompt conversation (re-rendered each turn)
    rewrites: bool = False  # the template rewrites history: every turn's prompt is rendered
    ids: list[int] = field(default_factory=list)  # the response region: sampled tokens and contexts
    sampled: list[bool] = field(default_factory=list)  # True where the policy sampled the token
    logprobs: list[float] = field(default_factory=list)  # the engine's, 0.0 on tool suffixes
    segment: list[int] = field(default_factory=list)  # the segment of each token of ids
    start: int = 0  # where the current segment starts in prompt_ids + ids
    messages: list[dict] = field(default_factory=list)  # the generated assistant and tool messages
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    has_eos: bool = False  # the last turn ended with an end id (the engine's eos_ids)
    truncated: bool = False  # the budget (max_new_tokens) ended it
    timed_out: bool = False  # a tool call timed out: the environment is never read again
    length: int = 0  # what the budget counted (max_new_tokens when it ended the episode): the overlong penalty's
    done: bool = False
    row: dict | None = None  # the dataset row it runs (an agent program is given it)

    @property
    def schemas(self) -> list[dict] | None:
        return [t.schema for t in self.tools.values()] or None

    @property
    def context(self) -> list[int]:
        """The current segment: the ids the next turn continues (and the turns sampled after them)."""
        return (self.prompt_ids + self.ids)[self.start :]

    @property
    def used(self) -> int:
        """What the budget counts: the current context after the prompt."""
        return max(0, len(self.context) - len(self.prompt_ids))

    @property
    def completion_ids(self) -> list[int]:
        """The conversation after the prompt as the model saw it last (its current context after
        the prompt): the response region when the history was never rewritten."""
        context, n = self.context, len(self.prompt_ids)
        return context[n:] if context[:n] == self.prompt_ids else context

    def extend(self, ids: list[int], logprobs: list[float] | None = None, new_segment: bool = False) -> None:
        """Append sampled ``ids`` (with their ``logprobs``) or, without logprobs, context ids —
        as the first ids of a new segment with ``new_segment``."""
        if new_segment:
            self.start = len(self.prompt_ids) + len(self.ids)
        number = (self.segment[-1] if self.segment else 0) + int(new_segment)
        self.ids += ids
        self.sampled += [logprobs is not None] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        self.segment += [number] * len(ids)


@takes("max_tool_calling_iterations", "max_tool_response_tokens", "tool_call_timeout")
class AgentOptions(ConfigFields):
    """How episodes run (``RLConfig``'s agent fields) and the model's name the episodes report."""

    model_name: str = "model"


def start_episode(
    tokenizer, messages: list[dict], tools: dict[str, Tool], environment=None, rewrites: bool | None = None
) -> Episode:
    """An episode of ``messages`` (the prompt conversation) with ``tools``; ``rewrites``: whether
    the chat template rewrites history (None: ``templates.rewrites_history`` finds out)."""
    schemas = [t.schema for t in tools.values()] or None
    rewrites = rewrites_history(tokenizer, schemas) if rewrites is None else rewrites
    return Episode(prompt_ids(tokenizer, messages, schemas), tools, environment, list(messages), rewrites)


def run_episodes(
    engine,
    tokenizer,
    episodes: list[Episode],
    sampling: SamplingParams,
    options: AgentOptions,
    seed: Seed = None,
    eos_ids=None,
) -> Rollout:
    """Run ``episodes`` to their end with ``engine`` and return them as one ``Rollout`` (rows in
    the order of ``episodes``, ``prompt_index`` None: episodes do not share a prompt pass;
    ``agents.rows.episodes_rollout``).

    ``seed``: one per episode (or an int ``s``: episode ``i`` gets ``s + i``; None: the engine's
    stream). An episode's first turn samples with its seed, turn ``t`` with ``sampling_seed(seed,
    t)``: its tokens never depend on which other episodes are still running.

    A turn ends where the engine's rollout ends it (``Rollout.has_eos``: at any of its ``eos_ids``);
    the tool suffix follows the template's end of turn, found among the tokenizer's EOS, ``eos_ids``
    (the model's end ids: ``Agent``'s) and the engine's ``eos_ids``."""
    budget = sampling.max_new_tokens
    eos_ids = eos_token_ids(tokenizer, eos_ids, getattr(engine, "eos_ids", None))
    seeds = row_seeds(seed, len(episodes), 1)
    with_logprobs = True
    for turn in range(options.max_tool_calling_iterations + 1):
        running = [k for k, e in enumerate(episodes) if not e.done]
        if not running:
            break
        turn_seeds = (
            None if seeds is None else [seeds[k] if turn == 0 else sampling_seed(seeds[k], turn) for k in running]
        )
        active = [episodes[k] for k in running]
        left = max(budget - e.used for e in active)
        out = engine.generate([e.context for e in active], 1, replace(sampling, max_new_tokens=left), seed=turn_seeds)
        with_logprobs = out.logprobs is not None
        pending = []
        for i, e in enumerate(active):
            new, logprobs, e.has_eos = _turn_tokens(out, i, budget - e.used)
            e.extend(new, logprobs)
            e.turns += 1
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
        _answer_tool_calls(tokenizer, pending, budget, options, eos_ids)
    for e in episodes:
        e.length = budget if e.truncated else e.used
    return episodes_rollout(episodes, tokenizer.pad_token_id, with_logprobs)


def _turn_tokens(out: Rollout, row: int, room: int) -> tuple[list[int], list[float], bool]:
    """The ids the engine sampled for ``row`` up to and including its EOS, at most ``room``, their
    log-probs, and whether they end the turn (the engine's EOS, not cut by ``room``)."""
    n = int(out.response_mask[row].sum())
    ids = out.response_ids[row, :n].tolist()[:room]
    logprobs = out.logprobs[row, :n].tolist()[:room] if out.logprobs is not None else [0.0] * len(ids)
    return ids, logprobs, bool(out.has_eos[row]) and 0 < n <= room


def _answer_tool_calls(tokenizer, pending: list, budget: int, options: AgentOptions, eos_ids=None) -> None:
    """Run the pending calls (``(episode, [function, ...])``: each episode's in order, the episodes
    side by side), then add each episode's tool messages and the context they make — or, when that
    leaves no room for another token, neither: the episode ends truncated."""
    results = run_tool_calls(
        [[(e.tools, f["name"], f["arguments"]) for f in fs] for e, fs in pending], options.tool_call_timeout
    )
    for (e, fs), answers in zip(pending, results):
        e.tool_errors += sum(a.failed for a in answers)
        if any(a.timed_out for a in answers):  # its environment may still change: the episode ends here
            e.timed_out = e.done = True
        tool_messages = [
            {"role": "tool", "name": f["name"], "content": _cut(tokenizer, a.text, options)}
            for f, a in zip(fs, answers)
        ]
        if e.rewrites:  # the next prompt is the template's rendering of the conversation
            rendered = prompt_ids(tokenizer, e.prompt_messages + e.messages + tool_messages, e.schemas)
            context = e.context
            new_segment = rendered[: len(context)] != context
            added = rendered if new_segment else rendered[len(context) :]
            would_use = len(rendered) - len(e.prompt_ids)
        else:  # the template's tool-message suffix, after the exact ids so far
            added = tool_suffix_ids(tokenizer, tool_messages, e.schemas, options.model_name, eos_ids)
            new_segment = False
            would_use = len(e.ids) + len(added)
        if would_use >= budget:  # no room left to answer: the episode ends here, unanswered
            e.truncated = e.done = True
            continue
        e.messages += tool_messages
        e.extend(added, new_segment=new_segment)


def _cut(tokenizer, text: str, options: AgentOptions) -> str:
    limit = options.max_tool_response_tokens
    ids = encode(tokenizer, text)
    if limit is None or len(ids) <= limit:
        return text
    return tokenizer.decode(ids[:limit]) + TRUNCATION_MARK
