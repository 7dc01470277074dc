"""``/v1/completions`` for ``rlhfkit serve``: a prompt (text, or token ids as given — never re-tokenised) sampled
on, and scored with ``prompt_logprobs`` in vLLM's layout, so that the served model can be a teacher of on-policy
distillation (``teacher_url``: ``models/remote_teacher.py``).

``prompt_logprobs: k`` (vLLM's extension; -1: the whole vocabulary): ``choices[i].prompt_logprobs`` has one entry per
prompt token — None for the first (nothing predicts it), then a dict keyed by token id holding the token that stands
there and the ``k`` most likely, each ``{"logprob", "rank", "decoded_token"}``; ``logprob`` the served model's
log-softmax at temperature 1 (the request's ``temperature`` only samples), ``rank`` 1 + how many ids score above it
(vLLM's: the count of ids scoring at least as much), ``decoded_token`` the token's text. ``echo`` puts the prompt's
text before the completion's and, with ``max_tokens`` 0, asks for no completion (vLLM's rules).

Fields taken: ``prompt`` (a string, a list of ids, or a list of either), ``max_tokens`` (default 16, as OpenAI's),
``temperature``, ``top_p``, ``n``, ``seed``, ``echo``, ``prompt_logprobs``, ``model``; ``stream``, ``logprobs``,
``stop``, ``suffix`` and ``best_of`` above 1 are refused in one line; any other field is ignored.
"""

from __future__ import annotations

import random
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from ..rollout.base import SamplingParams
from .protocol import MAX_N, BadRequest, number
from .tokens import visible_text

REFUSED = ("stream", "logprobs", "stop", "suffix")


@dataclass
class PromptScoring:
    """A queued ``/completions`` request, answered on the engine's thread by ``run``."""

    prompts: list[list[int]]
    texts: list[str | None]
    max_tokens: int
    sampling: SamplingParams
    n: int
    seed: int
    echo: bool
    top: int | None  # prompt_logprobs
    model: str
    future: Future = field(default_factory=Future)

    def run(self, endpoint) -> None:
        try:
            self.future.set_result(answer(endpoint, self))
        except Exception as err:  # noqa: BLE001 — the request's error, in its answer
            self.future.set_exception(err)


def parse_completion(endpoint, body) -> PromptScoring:
    """The request ``body`` checked against ``endpoint`` (its tokenizer, positions); ``BadRequest`` naming the field."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    for name in REFUSED:
        if body.get(name):
            raise BadRequest(f"{name} is not supported on /completions (ask prompt_logprobs for log-probs)", name)
    if (body.get("best_of") or 1) != 1:
        raise BadRequest("best_of is not supported: ask n completions", "best_of")
    prompts, texts = _prompts(endpoint, body.get("prompt"))
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        raise BadRequest(f"echo must be true or false, got {echo!r:.40}", "echo")
    max_tokens = number(body, "max_tokens", 0 if echo else 1, 10**7, integer=True)
    max_tokens = 16 if max_tokens is None else max_tokens
    top = number(body, "prompt_logprobs", -1, 10**7, integer=True)
    vocab = len(endpoint.tokenizer)
    top = vocab if top == -1 else None if top is None else min(top, vocab)
    if top is not None and endpoint.logprob_model is None:
        raise BadRequest(
            "prompt_logprobs needs the served model's log-probs, which this endpoint has not", "prompt_logprobs"
        )
    longest = max(map(len, prompts)) + max_tokens
    if endpoint.max_positions is not None and longest > endpoint.max_positions:
        raise BadRequest(f"prompt + max_tokens is {longest} tokens; the model has {endpoint.max_positions}", "prompt")
    t = number(body, "temperature", 0, 2)
    t = 1.0 if t is None else t
    sampling = SamplingParams(
        max_new_tokens=max(max_tokens, 1),
        temperature=t or 1.0,
        top_p=number(body, "top_p", 0, 1) or 1.0,
        greedy=t == 0,
    )
    seed = number(body, "seed", -(2**63), 2**63 - 1, integer=True)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("model must be a string (the served model's name)", "model")
    return PromptScoring(
        prompts,
        texts,
        max_tokens,
        sampling,
        number(body, "n", 1, MAX_N, integer=True) or 1,
        seed % 2**62 if seed is not None else random.getrandbits(62),
        echo,
        top,
        model or endpoint.model_name,
    )


def _prompts(endpoint, prompt) -> tuple[list[list[int]], list[str | None]]:
    """Each prompt's ids (text tokenised as vLLM does, special tokens added; ids as given) and its text, if given."""
    ints = lambda x: isinstance(x, list) and x and all(isinstance(i, int) and not isinstance(i, bool) for i in x)  # noqa: E731
    if isinstance(prompt, str) or ints(prompt):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt or not all(isinstance(p, str) or ints(p) for p in prompt):
        raise BadRequest("prompt must be a string, a list of token ids, or a non-empty list of either", "prompt")
    vocab = len(endpoint.tokenizer)
    ids: list[list[int]] = []
    texts: list[str | None] = []
    for k, p in enumerate(prompt):
        if isinstance(p, str):
            ids.append(endpoint.tokenizer(p)["input_ids"])
            texts.append(p)
        else:
            bad = [i for i in p if not 0 <= i < vocab]
            if bad:
                raise BadRequest(
                    f"prompt[{k}] holds token id {bad[0]}, outside the vocabulary (0..{vocab - 1})", "prompt"
                )
            ids.append(list(p))
            texts.append(None)
        if not ids[-1]:
            raise BadRequest(f"prompt[{k}] is empty", "prompt")
    return ids, texts


@torch.no_grad()
def prompt_logprobs(model, tokenizer, ids: list[int], top: int, rows: int = 256) -> list[dict | None]:
    """vLLM's ``prompt_logprobs`` of ``ids`` under ``model`` (module docstring), its logits read ``rows`` positions
    at a time in float32."""
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        x = torch.tensor([ids], device=device)
        logits = model(input_ids=x, attention_mask=torch.ones_like(x)).logits[0, :-1]
    finally:
        model.train(was_training)
    targets = torch.tensor(ids[1:], device=logits.device)
    out: list[dict | None] = [None]
    for start in range(0, len(targets), rows):
        lp = logits[start : start + rows].float().log_softmax(-1)
        chosen = lp.gather(-1, targets[start : start + rows, None])
        ranks = (lp >= chosen).sum(-1).tolist()
        best = lp.topk(top, -1) if top > 0 else None
        for r, (token, value, rank) in enumerate(
            zip(targets[start : start + rows].tolist(), chosen[:, 0].tolist(), ranks)
        ):
            entry = {token: (value, rank)}
            if best is not None:
                for k, (i, v) in enumerate(zip(best.indices[r].tolist(), best.values[r].tolist())):
                    entry[i] = (v, k + 1)
            out.append(
                {
                    str(i): {"logprob": v, "rank": k, "decoded_token": tokenizer.decode([i], skip_special_tokens=False)}
                    for i, (v, k) in entry.items()
                }
            )
    return out


def answer(endpoint, p: PromptScoring) -> dict:
    """The ``text_completion`` object of ``p``: its completions sampled (one ``engine.generate``) unless ``max_tokens``
    is 0, each prompt scored once when ``prompt_logprobs`` is asked."""
    engine, tokenizer = endpoint.serving.engine, endpoint.tokenizer
    rows: list[list[int]] = [[] for _ in range(len(p.prompts) * p.n)]
    lengths: list | None = None
    has_eos: list | None = None
    if p.max_tokens > 0:
        out = engine.generate(p.prompts, p.n, p.sampling, seed=[p.seed + k for k in range(len(p.prompts))])
        rows, lengths, has_eos = out.response_ids.tolist(), out.response_mask.sum(-1).tolist(), out.has_eos.tolist()
    scored = [
        prompt_logprobs(endpoint.logprob_model, tokenizer, ids, p.top) if p.top is not None else None
        for ids in p.prompts
    ]
    choices: list[dict] = []
    completion = 0
    for g, ids in enumerate(p.prompts):
        for j in range(p.n):
            r = g * p.n + j
            sampled = rows[r][: int(lengths[r])] if lengths is not None else []
            completion += len(sampled)
            text = visible_text(tokenizer, sampled, endpoint.hidden_ids)
            if p.echo:
                given = p.texts[g]
                text = (given if given is not None else tokenizer.decode(ids, skip_special_tokens=False)) + text
            ended = has_eos is not None and bool(has_eos[r]) and len(sampled) <= p.max_tokens
            choices.append(
                {
                    "index": len(choices),
                    "text": text,
                    "logprobs": None,
                    "finish_reason": "stop" if ended else "length",
                    "stop_reason": None,
                    "prompt_logprobs": scored[g],
                    "token_ids": sampled,
                }
            )
    prompt_tokens = sum(map(len, p.prompts))
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": p.model,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
        },
    }
