"""A teacher served elsewhere (``teacher_url``, ``config/teacher.py``): the policy's sampled sequences scored by an
OpenAI-compatible server's ``/completions`` with ``prompt_logprobs``, as vLLM's OpenAI server answers it (and
``rlhfkit serve``) — TRL's ``trl.experimental.server_distillation`` asks the same way.

Each row is sent as the token ids the policy saw — the attended ids of ``input_ids``: prompt, sampled tokens and an
agent's tool suffixes, never decoded and re-encoded — with ``max_tokens`` 1 and ``prompt_logprobs`` 1. The answer's
``choices[i].prompt_logprobs`` has one entry per prompt id: None for the first, then a dict keyed by token id (as a
string) holding at least the id that stands there, ``{"logprob", "rank", "decoded_token"}``. The log-prob of each
sampled token is read from the entry at its position; those are the server's raw log-probs, at temperature 1.

A request that fails (refused connection, HTTP 5xx or 429, no answer within ``timeout``) is sent again ``retries``
times, after 1, 2, 4, ... s; then ``teacher_logprobs`` raises one ``ValueError`` line naming ``teacher_url`` and what
failed. Plain ``urllib``: no client library, no dependency.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request

import torch

from .. import distributed

RETRY_STATUS = (429, 500, 502, 503, 504)


class RemoteTeacher:
    """The ``teacher_logprobs(rollout)`` of a teacher behind ``url`` (``.../v1``); ``model`` the served model's id
    (None: the server's default), ``batch_size`` sequences per request."""

    def __init__(
        self, url: str, model: str | None = None, batch_size: int = 8, retries: int = 2, timeout: float = 120.0
    ):
        self.url, self.model, self.batch_size = url.rstrip("/"), model, batch_size
        self.retries, self.timeout = retries, timeout
        self.requests = 0  # requests answered (for the measurements)

    def __repr__(self) -> str:
        return f"RemoteTeacher({self.url!r}, model={self.model!r})"

    def agreed_logprobs(self, rollout) -> torch.Tensor:
        """``teacher_logprobs``, its failure agreed by every process (``distributed.reduce_max``): the lowest failing
        rank raises it, the others leave quietly (``SystemExit``: no second line; torchrun stops the job), so a
        teacher that is down for everyone is said once, and no process waits in a collective for a failed one."""
        try:
            out = self.teacher_logprobs(rollout)
        except ValueError as err:
            if distributed.role_size() == 1:
                raise
            error: ValueError | None = err
        else:
            error = None
        world = distributed.role_size()
        if world > 1:
            rank = distributed.role_rank()
            first = world - distributed.reduce_max(world - rank if error is not None else 0)
            if first < world and rank == first and error is not None:
                raise error
            if first < world:
                raise SystemExit(1)
        return out

    @torch.no_grad()
    def teacher_logprobs(self, rollout) -> torch.Tensor:
        """(B, T) the served teacher's log-prob of each sampled token (``response_mask``), 0 elsewhere."""
        if getattr(rollout, "segments", None) is not None:
            raise ValueError(
                f"teacher_url {self.url}: episodes whose chat template rewrote their history (segments) are scored "
                "by a local teacher only (teacher_model without teacher_url)"
            )
        ids, attended, response = rollout.input_ids.cpu(), rollout.attention_mask.cpu().bool(), rollout.response_mask
        B, T = response.shape
        P = ids.shape[1] - T
        sequences = [ids[i][attended[i]].tolist() for i in range(B)]
        index = attended.long().cumsum(-1) - 1  # each column's place in its row's sent sequence
        out = torch.zeros(B, T, dtype=torch.float32)
        for start in range(0, B, self.batch_size):
            rows = range(start, min(start + self.batch_size, B))
            choices = self._score([sequences[i] for i in rows])
            for i, choice in zip(rows, choices):
                entries = choice.get("prompt_logprobs") if isinstance(choice, dict) else None
                if not isinstance(entries, list) or len(entries) != len(sequences[i]):
                    raise ValueError(
                        f"teacher_url {self.url}: the answer has no prompt_logprobs for each of the "
                        f"{len(sequences[i])} ids sent (is it vLLM's or rlhfkit's OpenAI server?)"
                    )
                for t in response[i].nonzero().flatten().tolist():
                    j = int(index[i, P + t])
                    out[i, t] = _chosen(entries[j], sequences[i][j], self.url)
        return out.to(rollout.response_mask.device)

    def _score(self, sequences: list[list[int]]) -> list:
        """The ``choices`` of one ``/completions`` request scoring ``sequences``, in order."""
        body = {"prompt": sequences, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 1}
        if self.model is not None:
            body["model"] = self.model
        answer = self._post("/completions", body)
        choices = answer.get("choices") if isinstance(answer, dict) else None
        if not isinstance(choices, list) or len(choices) != len(sequences):
            raise ValueError(
                f"teacher_url {self.url}: the answer has no choice for each of the {len(sequences)} prompts"
            )
        return sorted(choices, key=lambda c: c.get("index", 0) if isinstance(c, dict) else 0)

    def _post(self, path: str, body: dict) -> dict:
        """POST ``body`` as JSON, retried (module docstring); the parsed answer, or one ``ValueError`` line."""
        data = json.dumps(body).encode()
        failure = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(2.0 ** (attempt - 1), 30.0))
            request = urllib.request.Request(
                self.url + path, data=data, headers={"Content-Type": "application/json"}, method="POST"
            )
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    answer = json.loads(response.read())
                self.requests += 1
                return answer
            except urllib.error.HTTPError as err:
                failure = f"HTTP {err.code}{_error_message(err)}"
                if err.code not in RETRY_STATUS:
                    break
            except urllib.error.URLError as err:
                failure = _reason(err.reason, self.timeout)
            except TimeoutError:
                failure = f"no answer within teacher_timeout ({self.timeout} s)"
            except (ConnectionError, OSError) as err:
                failure = _reason(err, self.timeout)
            except json.JSONDecodeError:
                failure = "the answer is not JSON"
                break
        tries = f" after {attempt + 1} tries" if attempt else ""
        raise ValueError(f"teacher_url {self.url}: POST {path} failed{tries}: {failure}")


def _chosen(entry, token: int, url: str) -> float:
    """The log-prob of ``token`` in one position's ``{id: {"logprob", ...}}`` entry."""
    item = entry.get(str(token)) if isinstance(entry, dict) else None
    if item is None and isinstance(entry, dict):
        item = entry.get(token)
    if not isinstance(item, dict) or not isinstance(item.get("logprob"), (int, float)):
        raise ValueError(f"teacher_url {url}: the answer's prompt_logprobs leave out the sent token {token}")
    value = float(item["logprob"])
    if math.isnan(value):
        raise ValueError(f"teacher_url {url}: the answer's log-prob of the sent token {token} is NaN")
    return value  # vLLM writes -inf as -9999.0: kept, finite


def _reason(reason, timeout: float) -> str:
    if isinstance(reason, TimeoutError):
        return f"no answer within teacher_timeout ({timeout} s)"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused (is the server running?)"
    return f"{type(reason).__name__}: {reason}" if isinstance(reason, BaseException) else str(reason)


def _error_message(err: urllib.error.HTTPError) -> str:
    """The server's own one-line message (OpenAI's ``{"error": {"message"}}``), else its first 200 characters."""
    try:
        text = err.read().decode(errors="replace")
    except OSError:
        return ""
    try:
        message = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = text
    return ": " + " ".join(str(message).split())[:200] if message else ""
