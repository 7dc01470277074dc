"""``Endpoint``: an OpenAI-compatible chat-completions server on a rollout engine.

The HTTP side (``routes``: Starlette on uvicorn, in a thread of its own, on 127.0.0.1 and a free port)
checks each request (``protocol``), renders it with the trainer's chat template (``record.request_prompt``)
and queues it. The engine side runs on the *caller's* thread (``serve``): the trainer's, inside
``engine_ready`` (its autocast and gathered weights), so the engine is never called from two
threads. It takes the queued requests as one batch — every request that arrived within ``window``
seconds of the first, or at once when every running episode has one waiting — and samples them
with one ``engine.generate`` per sampling setting; then it decodes each turn, reads its tool
calls (``agents.parsing.parse_tool_calls``), records it in its episode and answers.

Two modes. Training (``training=True``, the trainer's): the run's sampling fields govern
(temperature, top_p, top_k; a request's own are ignored, as the trainer's log-probs assume the
run's), each episode's seeds are the trainer's (``record.EpisodeRecord.turn_seed``), a turn may
sample what is left of the episode's budget (``max_tokens`` can only lower it), ``n`` must be 1.
Serving (``rlhfkit serve``): the request's temperature (0: greedy), top_p, max_tokens, n and seed.

A request is rendered with the chat template as given, whatever the template; only a request of a
training episode that extends its last call, continuing the sampled turn token for token, needs a
template that ends an assistant turn with an EOS token (``agents.templates.check_agent_template``; refused in one
line otherwise). A request naming a model the endpoint does not serve (``served``: its name, and
``policy`` while training) is HTTP 404 ``model_not_found``, as OpenAI's API answers. ``content`` is
the text without special tokens (``tokens.visible_text``); log-probs carry each token's own bytes
(``tokens.TokenBytes``).
"""

from __future__ import annotations

import contextlib
import queue
import random
import socket
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..rollout.base import SamplingParams, sampling_seed
from .completions import PromptScoring
from .protocol import BadRequest, ChatRequest, length_answer, template_messages
from .record import EpisodeRecord, Serving, extends_last_call, request_prompt
from .sampling import answer_group

if TYPE_CHECKING:
    import uvicorn

    from .tokens import TokenBytes


@dataclass
class Pending:
    """A queued request: what to sample, with what (``serving``), and where its answer goes."""

    request: ChatRequest
    record: EpisodeRecord | None
    messages: list[dict]  # template form
    prompt_ids: list[int]
    sampling: SamplingParams
    seed: int | None
    turn: int
    future: Future
    serving: Serving | None = None


class Endpoint:
    """The server (``start``/``stop``, ``url``) and its engine loop (``serve``); see the module
    docstring. ``engine`` and ``sampling``: what requests outside a training episode are served
    with (a training episode brings its own: ``new_episode``); ``logprob_model``: the model that
    reports log-probs when the engine gives none (the policy: the HF engine in a synchronous run),
    reading its output layer as ``lm_head`` says (``models.lm_head``: the run's ``lm_head``);
    ``max_positions``: the model's positions."""

    def __init__(
        self,
        engine,
        tokenizer,
        sampling: SamplingParams,
        model_name: str = "policy",
        *,
        training=True,
        logprob_model=None,
        lm_head: str = "chunked",
        max_positions: int | None = None,
        window: float = 0.005,
        request_timeout: float = 600.0,
        host: str = "127.0.0.1",
        port: int = 0,
    ):
        self.serving, self.tokenizer, self.model_name = Serving(engine, sampling), tokenizer, model_name
        self.training, self.logprob_model, self.max_positions = training, logprob_model, max_positions
        self.lm_head = lm_head  # how logprob_model's passes read its output layer (models.lm_head), as the trainer's
        self.window, self.request_timeout, self.host, self.port = window, request_timeout, host, port
        self.queue: queue.Queue[Pending] = queue.Queue()
        self.episodes: dict[str, EpisodeRecord] = {}
        self.rewrites: dict[str, bool] = {}  # per tools: whether the template rewrites history
        self.server: uvicorn.Server | None = None
        self.thread: threading.Thread | None = None
        self.batches = 0  # engine.generate calls made (for the measurements)
        self.opened = 0  # episodes opened: a batch lists its requests in the order their episodes were
        self._hidden: set[int] | None = None
        self._bytes: TokenBytes | None = None

    @property
    def served(self) -> tuple[str, ...]:
        """The model names a request may give: the endpoint's, and ``policy`` while training (the
        name agent programs send); any other is HTTP 404 ``model_not_found``, as OpenAI's API has it."""
        return tuple(dict.fromkeys((self.model_name, "policy") if self.training else (self.model_name,)))

    @property
    def hidden_ids(self) -> set[int]:
        """The special ids ``content`` leaves out (``tokens.hidden_ids``), found once."""
        if self._hidden is None:
            from .tokens import hidden_ids

            self._hidden = hidden_ids(self.tokenizer)
        return self._hidden

    def token_bytes(self, ids: list[int]) -> list[list[int]]:
        """Each token's own UTF-8 bytes (``tokens.TokenBytes``)."""
        if self._bytes is None:
            from .tokens import TokenBytes

            self._bytes = TokenBytes(self.tokenizer)
        return self._bytes(ids)

    # ---------------------------------------------------------------- the HTTP side
    @property
    def url(self) -> str:
        """The base URL of the OpenAI API (``.../v1``); an episode's is ``episode_url(id)``."""
        return f"http://{self.host}:{self.port}/v1"

    def episode_url(self, episode_id: str) -> str:
        return f"http://{self.host}:{self.port}/episodes/{episode_id}/v1"

    def start(self) -> Endpoint:
        """Serve on ``host``:``port`` (0: a free port) in a daemon thread; returns once it listens."""
        try:
            import starlette  # noqa: F401
            import uvicorn
        except ImportError as err:
            raise ImportError(
                f"the endpoint needs starlette and uvicorn ({err}): pip install 'rlhfkit[serve]'"
            ) from None
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app(), log_level="warning", access_log=False, lifespan="off", timeout_keep_alive=60
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, daemon=True, name="rlhfkit-endpoint"
        )
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the endpoint did not start on {self.host}:{self.port}")
            time.sleep(0.002)
        return self

    def stop(self) -> None:
        """Stop serving (waits for the server thread, at most 5 s)."""
        if self.server is not None and self.thread is not None:  # start sets both
            self.server.should_exit = True
            self.thread.join(timeout=5)
            self.server = self.thread = None

    def app(self):
        """The Starlette application serving this endpoint (``routes.application``)."""
        from .routes import application

        return application(self)

    def prepare(self, request: ChatRequest, episode_id: str | None) -> Pending | dict:
        """The request rendered and its sampling chosen (module docstring); refused in one line
        when it cannot be served; a dict answer when the episode's budget is spent."""
        record, serving = None, self.serving
        if episode_id is not None:
            record = self.episodes.get(episode_id)
            if record is None:
                raise BadRequest(f"unknown episode {episode_id!r} (its step is over, or the URL is wrong)")
            if record.closed:
                raise BadRequest(f"episode {episode_id!r} is over: {record.closed}")
            serving = record.serving or serving
        if self.training and request.n != 1:
            raise BadRequest("n must be 1 while training: an episode continues one completion per request", "n")
        messages = template_messages(request.messages, record.call_names if record else {})
        tools = request.tools
        try:
            with record.lock if record is not None else contextlib.nullcontext():
                # Only a training episode's request that extends its last call continues a sampled turn token
                # for token, which needs a template ending the turn with an EOS token; others are rendered.
                extends = self.training and extends_last_call(record, messages, tools)
                eos_ids = getattr(serving.engine, "eos_ids", None)
                rewrites = self._rewrites(tools, eos_ids) if extends else True
                ids = request_prompt(self.tokenizer, record, messages, tools, rewrites, eos_ids)
                turn = len(record.calls) if record is not None else 0
        except BadRequest:
            raise
        except Exception as err:  # noqa: BLE001 — a template error on the messages given
            raise BadRequest(f"the chat template cannot render these messages: {type(err).__name__}: {err}") from None
        return self._sampling(request, record, messages, ids, turn, serving)

    def _rewrites(self, tools, eos_ids) -> bool:
        """Whether the template rewrites history (``agents.templates.check_agent_template``, once per
        tools); refused in one line when its turns cannot be continued token for token."""
        key = repr(tools)
        if key not in self.rewrites:
            from ..agents.templates import check_agent_template

            try:
                self.rewrites[key] = check_agent_template(self.tokenizer, tools, self.model_name, eos_ids)
            except ValueError as err:
                raise BadRequest(str(err)) from None
        return self.rewrites[key]

    def _sampling(self, request, record, messages, ids, turn, serving: Serving) -> Pending | dict:
        room = request.max_tokens or serving.sampling.max_new_tokens
        if self.training:
            sampling, seed = serving.sampling, (record.turn_seed(sampling_seed, turn) if record is not None else None)
            if record is not None and record.budget is not None:
                room = min(room, record.budget - record.used(ids))
        else:
            t = 1.0 if request.temperature is None else request.temperature
            sampling = SamplingParams(
                max_new_tokens=1, temperature=t or 1.0, top_p=request.top_p or 1.0, top_k=0, greedy=t == 0
            )
            seed = request.seed % 2**62 if request.seed is not None else random.getrandbits(62)
        if self.max_positions is not None:
            room = min(room, self.max_positions - len(ids))
        if room < 1:
            if not self.training or record is None or record.budget is None or record.used(ids) < record.budget:
                raise BadRequest(
                    f"the prompt is {len(ids)} tokens: no room left to sample ({self.max_positions} positions)",
                    "messages",
                )
            record.truncated = True  # the episode's budget is spent: it ends here, as a cut episode does
            record.closed = "its token budget (max_new_tokens) is spent"
            return length_answer(request.model or self.model_name, len(ids))
        return Pending(
            request, record, messages, ids, replace(sampling, max_new_tokens=room), seed, turn, Future(), serving
        )

    # ---------------------------------------------------------------- the engine side (the caller's thread)
    def serve(self, until, expected=None, poll: float = 0.01) -> None:
        """Answer queued requests until ``until()`` is true: each batch is the first request and
        every one arriving until the queue has been quiet for ``window`` s (1 s at most) — at once
        when ``expected()`` (the episodes that may still send one) are all waiting."""
        while not until():
            try:
                batch = [self.queue.get(timeout=poll)]
            except queue.Empty:
                continue
            start = last = time.monotonic()
            while True:
                while not self.queue.empty():
                    batch.append(self.queue.get_nowait())
                    last = time.monotonic()
                now = time.monotonic()
                left = min(self.window - (now - last), 1.0 - (now - start))  # a quiet gap, or 1 s in all
                if (expected is not None and len(batch) >= expected()) or left <= 0:
                    break
                try:
                    batch.append(self.queue.get(timeout=left))
                    last = time.monotonic()
                except queue.Empty:
                    break
            self.answer(batch)

    def answer(self, batch: list) -> None:
        """Sample ``batch`` (one ``engine.generate`` per engine, weights version and sampling
        setting), record and answer it."""
        batch = [p for p in batch if p.future.set_running_or_notify_cancel()]
        for scoring in [p for p in batch if isinstance(p, PromptScoring)]:  # /completions: one by one
            scoring.run(self)
        batch = [p for p in batch if not isinstance(p, PromptScoring)]
        batch.sort(key=lambda p: p.record.order if p.record is not None else 2**62)  # episodes in their order
        groups: dict[tuple, list[Pending]] = {}
        for p in batch:
            s = p.sampling
            key = (id(p.serving.engine), p.serving.version, s.temperature, s.top_p, s.top_k, s.greedy, p.request.n)
            groups.setdefault(key, []).append(p)
        for group in groups.values():
            self.batches += 1
            try:
                answers = answer_group(self, group, group[0].serving)
            except Exception as err:  # noqa: BLE001 — every request of the group gets the error
                for p in group:
                    p.future.set_exception(err)
                continue
            for p, a in zip(group, answers):
                p.future.set_result(a)

    def new_episode(
        self, seed: int | None = None, budget: int | None = None, serving: Serving | None = None
    ) -> EpisodeRecord:
        """Open a training episode (its requests go to ``episode_url(record.id)``): its sampling
        ``seed``, token ``budget`` and ``serving`` — the engine, sampling and weights version its
        requests are served with (None: the endpoint's own)."""
        self.opened += 1
        record = EpisodeRecord(uuid.uuid4().hex[:16], seed, budget, order=self.opened, serving=serving)
        self.episodes[record.id] = record
        return record
