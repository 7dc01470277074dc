"""The activation memory of rlhfkit's training pass at a real model's widths, as its memory probe
measures it (``rlhfkit/models/activations.py``), and what that means at a given depth, length and card.

    .venv/bin/python benchmarks/activation_cost.py --shape qwen2.5-7b --layers 1,2 --autocast bfloat16 \\
        --plan-layers 28 --plan-tokens 8192 --plan-rows 8 --card-gb 80

A randomly initialised Qwen2 of the named widths (``--shape``; nothing downloaded) at each of
``--layers`` depths runs the RL update's forward pass (``models.policy.forward_response``: the streamed
LM head, SDPA, left-aligned rows) under ``--autocast`` over float32 weights, and the probe counts the
bytes its autograd graph keeps per token, with every layer checkpointed and without. The difference
between two depths, divided by the layers between them, is the cost **per layer per token**: what the
depth multiplies (the embedding, the final norm and the head's saved hidden states are the rest).
``--plan-*`` works that out for one micro-batch of a deeper model: the activations kept with and
without checkpointing, the training state (16 bytes a parameter: float32 weights, gradient, AdamW's
two moments; / ``--shards`` under FSDP2) and what is left on a ``--card-gb`` card.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2),  # the test's
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_attention_heads=14, num_key_value_heads=2),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_attention_heads=28, num_key_value_heads=4),
}
PARAMS = {
    "tiny": 0.0,
    "qwen2.5-0.5b": 494e6,
    "qwen2.5-7b": 7.62e9,
}  # the real models' parameter counts (the 7B's head untied)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    p.add_argument("--layers", default="1,2", help="two depths (comma-separated)")
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--autocast", choices=["bfloat16", "none"], default="bfloat16")
    p.add_argument("--plan-layers", type=int, default=28)
    p.add_argument("--plan-tokens", type=int, default=8192, help="tokens per row (prompt + completion)")
    p.add_argument("--plan-rows", type=int, default=8, help="rows per micro-batch")
    p.add_argument("--card-gb", type=float, default=80.0)
    p.add_argument("--shards", type=int, default=1, help="FSDP2 processes the training state is sharded over")
    return p.parse_args(argv)


def measure(a, layers: int):
    import torch

    from benchmarks.models import build_model, qwen_like_tokenizer
    from rlhfkit.models.activations import checkpointable_layers, measure_activation_cost
    from rlhfkit.models.loading import enable_activation_checkpointing
    from rlhfkit.models.policy import forward_response

    tok = qwen_like_tokenizer(a.vocab)
    shape = dict(SHAPES[a.shape], num_hidden_layers=layers, vocab_size=a.vocab, max_position_embeddings=32768)
    model = build_model(shape, tok, torch.device("cpu"), torch.float32)
    enable_activation_checkpointing(model)
    model.train()
    blocks = checkpointable_layers(model)

    def forward(n):
        ids = (torch.arange(n) % (a.vocab - 1))[None]
        context = torch.autocast("cpu", dtype=torch.bfloat16) if a.autocast != "none" else torch.enable_grad()
        with context:
            return forward_response(model, ids, torch.ones_like(ids), n - 1, with_entropy=True).logprobs.sum()

    return measure_activation_cost(forward, [model], blocks, True, layers)


def main(argv=None) -> None:
    a = parse(argv)
    depths = [int(x) for x in a.layers.split(",")]
    if len(depths) != 2 or depths[0] >= depths[1]:
        sys.exit("--layers: two increasing depths, e.g. 1,2")
    costs = {d: measure(a, d) for d in depths}
    lo, hi = costs[depths[0]], costs[depths[1]]
    per_layer = {
        m: (hi_c[1] - lo_c[1]) / (depths[1] - depths[0])
        for m, lo_c, hi_c in (("off", lo.off, hi.off), ("on", lo.on, hi.on))
    }
    rest = {m: lo_c[1] - per_layer[m] * depths[0] for m, lo_c in (("off", lo.off), ("on", lo.on))}
    out = {
        "shape": a.shape,
        "autocast": a.autocast,
        "depths": depths,
        "bytes_per_token_per_layer": per_layer,
        "bytes_per_token_outside_layers": rest,
        "mb_per_layer_per_1k_tokens": {m: v * 1000 / 1e6 for m, v in per_layer.items()},
    }
    tokens = a.plan_rows * a.plan_tokens
    state = 16 * PARAMS[a.shape] / a.shards
    plan = {m: (per_layer[m] * a.plan_layers + rest[m]) * tokens for m in ("off", "on")}
    recompute = per_layer["off"] * tokens  # the one layer backward recomputes at a time
    out["plan"] = {
        "layers": a.plan_layers,
        "rows": a.plan_rows,
        "tokens_per_row": a.plan_tokens,
        "training_state_gb": state / 1e9,
        "activations_off_gb": plan["off"] / 1e9,
        "activations_on_gb": (plan["on"] + recompute) / 1e9,
        "card_gb": a.card_gb,
        "left_for_activations_gb": a.card_gb - state / 1e9,
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
