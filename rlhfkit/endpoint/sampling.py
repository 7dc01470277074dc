"""One batch of the endpoint's requests through the engine: sampled, cut (each request's own
``max_tokens`` and ``stop``), decoded, parsed for tool calls, recorded in its episode and answered."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import torch

from ..agents.parsing import MalformedToolCall, parse_tool_calls
from .protocol import completion_response, openai_tool_calls
from .record import Call
from .tokens import TokenBytes, hidden_ids, visible_text


def answer_group(endpoint, group: list, serving) -> list[dict]:
    """The answers of ``group`` (``server.Pending`` requests sharing a sampling setting and ``n``)
    by ``serving`` (``record.Serving``: the engine, and the weights version recorded with each
    call): one ``engine.generate`` call for all of them, sized for the longest ``max_new_tokens``."""
    n = group[0].request.n
    sampling = replace(group[0].sampling, max_new_tokens=max(p.sampling.max_new_tokens for p in group))
    seeds = [p.seed for p in group]
    out = serving.engine.generate(
        [p.prompt_ids for p in group], n, sampling, seed=None if any(s is None for s in seeds) else seeds
    )
    lengths = out.response_mask.sum(-1).tolist()
    rows = out.response_ids.tolist()
    engine_logprobs = out.logprobs.tolist() if out.logprobs is not None else None
    policy_logprobs = None
    if engine_logprobs is None and endpoint.logprob_model is not None and any(p.request.logprobs for p in group):
        policy_logprobs = _policy_logprobs(endpoint.logprob_model, out, sampling.temperature, endpoint.lm_head)
    answers = []
    for g, p in enumerate(group):
        choices = []
        for j in range(n):
            r = g * n + j
            ids = rows[r][: min(int(lengths[r]), p.sampling.max_new_tokens)]
            # ended: the engine ended it (at any of its eos_ids, e.g. Gemma 2's <end_of_turn>), within max_tokens
            ended = bool(out.has_eos[r]) and int(lengths[r]) <= p.sampling.max_new_tokens
            ids, stopped = _cut_at_stop(endpoint, ids, p.request.stop)
            sampled = engine_logprobs[r][: len(ids)] if engine_logprobs is not None else None
            shown = sampled if sampled is not None else (policy_logprobs[r][: len(ids)] if policy_logprobs else None)
            choice = _choice(endpoint, p, ids, ended, sampled, shown, stopped, f"{p.turn}_{j}", serving.version)
            choices.append(choice)
        model = getattr(p.request, "model", None) or endpoint.model_name  # the name asked for (a served one)
        answers.append(completion_response(f"chatcmpl-{uuid.uuid4().hex}", model, len(p.prompt_ids), choices))
    return answers


def _choice(endpoint, p, ids: list[int], ended: bool, sampled, shown, stopped: bool, tag: str, version: int) -> dict:
    """One choice: its message (tool calls parsed with the agents' parser), finish reason, ids,
    tokens and log-probs (``shown`` when the request asked); recorded in the request's episode.
    ``ended``: the engine ended the completion with one of its end ids (the last of ``ids``)."""
    tokenizer = endpoint.tokenizer
    eos = bool(ids) and ended and not stopped
    text = visible_text(tokenizer, ids[:-1] if eos else ids, _hidden(endpoint))  # no <pad>: vLLM's default
    found = [text.find(s) for s in p.request.stop if s in text] if stopped else []
    if found:  # the stop string is not returned (OpenAI's rule); its tokens stay recorded
        text = text[: min(found)]
    calls: list[dict] = []
    content, malformed = text, False
    if p.request.tools and p.request.tool_choice != "none" and eos:
        try:
            content, calls = parse_tool_calls(text, tokenizer, p.request.tools)
        except MalformedToolCall:
            malformed = True
    call_ids = [f"call_{p.record.id if p.record else uuid.uuid4().hex[:8]}_{tag}_{k}" for k in range(len(calls))]
    message: dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
    if calls:
        message["tool_calls"] = openai_tool_calls(calls, call_ids)
    finish = "tool_calls" if calls else "stop" if eos or stopped else "length"
    if p.record is not None and endpoint.training:
        reply = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
        call = Call(
            list(p.prompt_ids),
            ids,
            sampled,
            version,
            p.messages,
            p.request.tools,
            reply,
            eos,
            len(calls),
            malformed,
        )
        with p.record.lock:
            if p.record.closed is None:
                p.record.calls.append(call)
                p.record.call_names.update({i: c["function"]["name"] for i, c in zip(call_ids, calls)})
    asked = shown is not None and p.request.logprobs
    tokens = [tokenizer.decode([i], skip_special_tokens=False) for i in ids] if asked else []
    return {
        "message": message,
        "finish_reason": finish,
        "token_ids": ids,
        "tokens": tokens,
        "bytes": _token_bytes(endpoint, ids) if asked else [],
        "logprobs": shown if asked else None,
    }


def _hidden(endpoint) -> set[int]:
    """The special ids ``content`` leaves out: the endpoint's (found once), else the tokenizer's."""
    hidden = getattr(endpoint, "hidden_ids", None)
    return hidden if hidden is not None else hidden_ids(endpoint.tokenizer)


def _token_bytes(endpoint, ids: list[int]) -> list[list[int]]:
    of = getattr(endpoint, "token_bytes", None)
    return of(ids) if of is not None else TokenBytes(endpoint.tokenizer)(ids)


def _cut_at_stop(endpoint, ids: list[int], stop: list[str]) -> tuple[list[int], bool]:
    """``ids`` up to the token that completes the first ``stop`` string (kept: the model sampled
    it, and the trainer trains it in that context), and whether one was found. Stop strings are
    looked for in the text ``content`` shows (no special token), spelled from the tokens' own bytes,
    so a character split over several byte tokens is found where its last byte completes it."""
    if not stop:
        return ids, False
    import codecs

    hidden, decoder, text = _hidden(endpoint), codecs.getincrementaldecoder("utf-8")(errors="replace"), ""
    longest = max(map(len, stop))
    for k, (i, piece) in enumerate(zip(ids, _token_bytes(endpoint, ids))):
        if i in hidden:
            continue
        new = decoder.decode(bytes(piece))  # "" until a character's last byte
        text += new
        tail = text[-(longest + len(new)) :]  # a stop string first found now ends in the new text
        if new and any(s in tail for s in stop):
            return ids[: k + 1], True
    return ids, False


@torch.no_grad()
def _policy_logprobs(model, out, temperature: float, lm_head: str) -> list[list[float]]:
    """The policy's log-prob of each sampled token, as the trainer computes old log-probs
    (``models.policy.forward_response``: logits over the sampling temperature, the output layer read as
    ``lm_head`` says)."""
    from ..models.policy import forward_response

    was_training = model.training
    model.eval()
    try:
        n = out.response_ids.shape[1]
        lp = forward_response(model, out.input_ids, out.attention_mask, n, temperature, lm_head=lm_head).logprobs
    finally:
        model.train(was_training)
    return (lp.float() * out.response_mask).tolist()
