"""``rlhfkit serve MODEL_DIR``: a trained model behind the OpenAI-compatible chat-completions
endpoint (``rlhfkit.endpoint.Endpoint`` in serving mode: each request's own temperature, top_p,
max_tokens, n, stop and seed), on HF generate. The command's parser (``add_command``) is all
``cli.py`` holds of it."""

from __future__ import annotations


def add_command(sub) -> None:
    """The ``serve`` subcommand on the CLI's subparsers."""
    s = sub.add_parser(
        "serve",
        allow_abbrev=False,
        help="serve a model directory as an OpenAI-compatible chat-completions endpoint "
        "(POST /v1/chat/completions, GET /v1/models)",
    )
    s.add_argument("model_dir")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: a free one)")
    s.add_argument("--name", help="the model's id in /v1/models (default: the directory's name)")
    s.add_argument("--chat-template", help="a chat template: a file, inline Jinja or a shipped name (chatml_tools)")
    s.add_argument("--max-tokens", type=int, default=256, help="a request's max_tokens when it gives none")
    s.add_argument("--device", default="auto", help="cpu, cuda or auto (default)")
    s.add_argument(
        "--window",
        type=float,
        default=0.005,
        help="seconds a batch waits for more requests after its first (default 0.005)",
    )
    s.set_defaults(func=serve)


def build_endpoint(
    model_dir: str,
    name: str | None = None,
    chat_template: str | None = None,
    max_tokens: int = 256,
    device: str = "auto",
    host: str = "127.0.0.1",
    port: int = 0,
    window: float = 0.005,
):
    """The model of ``model_dir`` (and its tokenizer) on an HF engine behind an ``Endpoint``."""
    from pathlib import Path

    from .data.chat_templates import use_chat_template
    from .endpoint import Endpoint
    from .models.loading import load_causal_lm, load_tokenizer
    from .models.rl_models import resolve_device
    from .rollout import HFEngine
    from .rollout.base import SamplingParams

    tokenizer = load_tokenizer(model_dir)
    use_chat_template(tokenizer, chat_template)
    model = load_causal_lm(model_dir).to(resolve_device(device)).eval()
    engine = HFEngine(model, tokenizer.pad_token_id, tokenizer.eos_token_id)
    positions = getattr(model.config, "max_position_embeddings", None)
    return Endpoint(
        engine,
        tokenizer,
        SamplingParams(max_new_tokens=max_tokens),
        name or Path(model_dir).name,
        training=False,
        logprob_model=model,
        max_positions=positions,
        host=host,
        port=port,
        window=window,
    )


def serve(args) -> int:
    """Serve until interrupted (Ctrl-C)."""
    endpoint = build_endpoint(
        args.model_dir, args.name, args.chat_template, args.max_tokens, args.device, args.host, args.port, args.window
    ).start()
    print(
        f"serving {endpoint.model_name} at {endpoint.url} (POST /chat/completions, GET /models); Ctrl-C stops",
        flush=True,
    )
    try:
        endpoint.serve(until=lambda: False)
    except KeyboardInterrupt:
        pass
    finally:
        endpoint.stop()
    return 0
