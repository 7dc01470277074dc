"""The HTTP side of an ``Endpoint`` (``server.py``): its Starlette application (``application``) and the
handlers of its routes (``Routes``) — OpenAI's model list and chat completions, at ``/v1`` and at an
episode's ``/episodes/{episode}/v1``, and for ``rlhfkit serve`` ``/v1/completions`` (``completions.py``).

A handler checks the request (``protocol.parse_request``), has the endpoint prepare it
(``Endpoint.prepare``: rendered, its sampling chosen) and queues it for the engine's thread, then
answers when that thread is done (``reply``). Every error is OpenAI's ``{"error": {...}}`` body
(``protocol.error_body``), in one line: 400 for a request refused, 404 ``model_not_found`` for a model
the endpoint does not serve, 504 when no answer comes within ``request_timeout``, 500 for the engine's
errors. Imported when the server starts: starlette is an optional dependency (``rlhfkit[serve]``).
"""

from __future__ import annotations

import asyncio

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .completions import parse_completion
from .protocol import BadRequest, error_body, parse_request


def application(endpoint) -> Starlette:
    """The Starlette application of ``endpoint``: the model list and chat completions at ``/v1`` and
    at each episode's URL, and ``/v1/completions`` when it is not training (``rlhfkit serve``: the
    served model also scores and continues prompts)."""
    routes = Routes(endpoint)
    table = [
        Route("/v1/models", routes.models),
        Route("/episodes/{episode}/v1/models", routes.models),
        Route("/v1/chat/completions", routes.chat, methods=["POST"]),
        Route("/episodes/{episode}/v1/chat/completions", routes.chat, methods=["POST"]),
    ]
    if not endpoint.training:
        table.append(Route("/v1/completions", routes.completions, methods=["POST"]))
    return Starlette(routes=table, exception_handlers={HTTPException: routes.http_error})


class Routes:
    """The handlers of ``endpoint``'s routes: Starlette calls each with the request."""

    def __init__(self, endpoint):  # a server.Endpoint (not imported: server imports this module)
        self.endpoint = endpoint

    async def models(self, request: Request) -> JSONResponse:
        """The models a request may name (``Endpoint.served``), as OpenAI's ``/v1/models`` lists them."""
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": name, "object": "model", "created": 0, "owned_by": "rlhfkit"}
                    for name in self.endpoint.served
                ],
            }
        )

    async def chat(self, request: Request) -> JSONResponse:
        """A chat completion: the request checked, prepared for its episode (the URL's, or the
        ``x-episode-id`` header's; none outside an episode) and answered when sampled — at once
        when the episode's budget is spent."""
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse(error_body("the request body is not JSON"), status_code=400)
        try:
            parsed = parse_request(body)
            if parsed.model is not None and parsed.model not in self.endpoint.served:
                return self._model_not_found(parsed.model)
            pending = self.endpoint.prepare(
                parsed, request.path_params.get("episode") or request.headers.get("x-episode-id")
            )
        except BadRequest as err:
            return JSONResponse(error_body(str(err), param=err.param), status_code=400)
        if isinstance(pending, dict):  # answered without sampling (no budget left)
            return JSONResponse(pending)
        return await self.reply(pending)

    def _model_not_found(self, model: str) -> JSONResponse:
        """HTTP 404 ``model_not_found`` for a chat request naming a model not served, as OpenAI's API answers."""
        served = ", ".join(f"`{m}`" for m in self.endpoint.served)
        return JSONResponse(
            error_body(
                f"The model `{model}` does not exist or you do not have access to it; this endpoint serves {served}",
                param="model",
                code="model_not_found",
            ),
            status_code=404,
        )

    async def completions(self, request: Request) -> JSONResponse:
        """``rlhfkit serve``'s ``/v1/completions``, with vLLM's ``prompt_logprobs`` (``completions.py``)."""
        try:
            pending = parse_completion(self.endpoint, await request.json())
            if pending.model not in self.endpoint.served:
                raise BadRequest(
                    f"The model `{pending.model}` does not exist; this endpoint serves `{self.endpoint.model_name}`",
                    "model",
                )
        except ValueError as err:  # BadRequest, or a body that is not JSON
            param = getattr(err, "param", None)
            message = str(err) if isinstance(err, BadRequest) else "the request body is not JSON"
            return JSONResponse(error_body(message, param=param), status_code=404 if param == "model" else 400)
        return await self.reply(pending)

    async def reply(self, pending) -> JSONResponse:
        """``pending`` queued for the engine's thread (``Endpoint.serve``), answered when it is done."""
        endpoint = self.endpoint
        endpoint.queue.put(pending)
        try:
            answer = await asyncio.wait_for(asyncio.wrap_future(pending.future), endpoint.request_timeout)
        except (asyncio.TimeoutError, TimeoutError):
            pending.future.cancel()
            return JSONResponse(
                error_body(
                    f"no answer within {endpoint.request_timeout} s (the engine is not serving this request)",
                    "timeout",
                ),
                status_code=504,
            )
        except BadRequest as err:
            return JSONResponse(error_body(str(err)), status_code=400)
        except Exception as err:  # noqa: BLE001 — the engine's errors, in one line
            return JSONResponse(error_body(f"{type(err).__name__}: {err}", "server_error"), status_code=500)
        return JSONResponse(answer)

    async def http_error(self, request: Request, exc) -> JSONResponse:
        """Starlette's own errors (``HTTPException``: an unknown path, a method not allowed) in OpenAI's
        error body."""
        return JSONResponse(
            error_body(f"{request.method} {request.url.path}: {exc.detail}"), status_code=exc.status_code
        )
