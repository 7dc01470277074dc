"""What the endpoint records of an episode, and the training row it becomes.

Every request of an episode is rendered here with the trainer's chat template and recorded as a
``Call``: its prompt ids, the sampled ids, the engine's log-probs, the weights version, the
conversation in template form and the reply. The training row is built from those ids alone
(``episode_from_calls``) — never by tokenising what the agent sends back:

- a request whose history is a *strict extension* of the episode's last call (its messages up to
  and including the reply this endpoint returned are that call's, the tools are the same, the
  turn ended at EOS, the template is prefix-preserving) is prompted with the exact ids so far —
  the last call's prompt and sampled ids — plus the template's suffix for the new messages
  (``agents.templates.tool_suffix_ids``): exactly what ``environment_factory=`` episodes continue;
- any other request (the agent dropped or rewrote a message, branched from an older call, changed
  the tools; a template that rewrites history) is the template's own rendering of the messages.

``episode_from_calls`` then follows the rule of templates that rewrite history (``agents.rows``):
a call whose prompt starts with the current context (the last call's prompt and sampled ids) adds
only its new tokens; any other starts a new segment. Every sampled token is trained once, in the
context it was sampled in; an append-only episode is one segment, the row ``episodes_rollout``
builds for ``environment_factory=``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ..agents.episode import Episode
from ..agents.templates import prompt_ids, tool_suffix_ids
from ..rollout.base import SamplingParams


@dataclass(frozen=True)
class Serving:
    """What a request is served with: the ``engine``, the run's ``sampling`` and the weights'
    ``version`` (optimizer steps behind the weights the engine samples; recorded with each call).
    A training episode's are given when it opens (``Endpoint.new_episode``); other requests get
    the endpoint's own (``Endpoint.serving``)."""

    engine: object
    sampling: SamplingParams
    version: int = 0


@dataclass
class Call:
    """One sampled completion of an episode's request (the choice the reply returned)."""

    prompt_ids: list[int]
    ids: list[int]  # the sampled ids, the EOS included when the turn ended there
    logprobs: list[float] | None  # the engine's (None: it reports none, as the HF engine in a synchronous run)
    version: int  # optimizer steps behind the weights that sampled it
    messages: list[dict]  # the request's conversation in template form
    tools: list[dict] | None
    reply: dict  # the returned assistant message in template form
    has_eos: bool
    tool_calls: int = 0
    malformed: bool = False


@dataclass
class EpisodeRecord:
    """The calls of one episode (``id``: the ``/episodes/<id>/v1`` path of its base URL), its
    sampling seed and token budget, and whether it ended (``closed``: no request is answered after)."""

    id: str
    seed: int | None = None
    budget: int | None = None
    order: int = 0  # the batches list episodes' requests in this order (the trainer's episode order)
    calls: list[Call] = field(default_factory=list)
    call_names: dict[str, str] = field(default_factory=dict)  # tool-call id -> function name
    truncated: bool = False  # a request found no room left in the budget
    closed: str | None = None  # why requests are refused now (time limit, episode over)
    serving: Serving | None = None  # the engine, sampling and version its requests are served with
    lock: threading.Lock = field(default_factory=threading.Lock)

    def turn_seed(self, seed_of, turn: int) -> int | None:
        """The seed of the episode's ``turn``-th call: its own seed, then ``seed_of(seed, turn)`` —
        the rule of ``agents.episode.run_episodes``."""
        if self.seed is None:
            return None
        return self.seed if turn == 0 else seed_of(self.seed, turn)

    def used(self, ids: list[int]) -> int:
        """What the budget counts for a call prompted with ``ids``: its context after the prompt."""
        return max(0, len(ids) - len(self.calls[0].prompt_ids)) if self.calls else 0


def extends_last_call(record: EpisodeRecord | None, messages: list[dict], tools: list[dict] | None) -> bool:
    """Whether a request continues the episode's last call: its turn ended at EOS, the tools are the
    same, and the messages are that call's, then the reply it returned, then new ones."""
    last = record.calls[-1] if record is not None and record.calls else None
    if last is None or not last.has_eos or tools != last.tools:
        return False
    n = len(last.messages)
    return messages[:n] == last.messages and len(messages) > n and messages[n] == last.reply


def request_prompt(
    tokenizer,
    record: EpisodeRecord | None,
    messages: list[dict],
    tools: list[dict] | None,
    rewrites: bool,
    eos_ids=None,
) -> list[int]:
    """The prompt ids of a request (module docstring): the exact ids so far plus the new messages'
    suffix when the request extends the episode's last call (``extends_last_call``), else the
    template's rendering. ``eos_ids``: the model's end-of-turn ids (``models.loading.eos_token_ids``;
    None: the tokenizer's EOS)."""
    if not rewrites and record is not None and extends_last_call(record, messages, tools):
        last, n = record.calls[-1], len(record.calls[-1].messages)
        try:
            return last.prompt_ids + last.ids + tool_suffix_ids(tokenizer, messages[n + 1 :], tools, eos_ids=eos_ids)
        except ValueError:  # the template is not prefix-preserving for these messages: render them
            pass
    return prompt_ids(tokenizer, messages, tools)


def episode_from_calls(
    calls: list[Call], tokenizer, budget: int, truncated: bool = False, row: dict | None = None
) -> Episode:
    """The ``agents.episode.Episode`` of recorded ``calls`` (module docstring): its prompt, response
    region (sampled ids with their log-probs, context ids masked out), segments, conversation
    (the last call's messages after the first call's prompt, and the reply) and counts; ``row``:
    the dataset row it ran."""
    first = calls[0]
    episode = Episode(list(first.prompt_ids), {}, None, row=row)
    for k, call in enumerate(calls):
        if k:
            context = episode.context
            if call.prompt_ids[: len(context)] == context:
                if len(call.prompt_ids) > len(context):
                    episode.extend(call.prompt_ids[len(context) :])
            else:
                episode.extend(list(call.prompt_ids), new_segment=True)
        episode.extend(list(call.ids), list(call.logprobs) if call.logprobs is not None else [0.0] * len(call.ids))
    last = calls[-1]
    n = len(first.messages)
    history = last.messages[n:] if last.messages[:n] == first.messages else last.messages
    episode.messages = [*history, last.reply]
    episode.turns = len(calls)
    episode.tool_calls = sum(c.tool_calls for c in calls)
    episode.tool_errors = sum(c.malformed for c in calls)
    episode.has_eos = last.has_eos
    episode.truncated = truncated or not last.has_eos
    episode.length = budget if episode.truncated else episode.used
    episode.done = True
    return episode


def empty_episode(tokenizer, messages: list[dict], row: dict | None = None) -> Episode:
    """An episode of the dataset ``row`` before (or without) any call: the prompt ``messages``
    rendered, nothing sampled — the row of an episode whose program failed or made no call, left
    unscored by the caller."""
    return Episode(prompt_ids(tokenizer, messages, None), {}, None, done=True, row=row)
