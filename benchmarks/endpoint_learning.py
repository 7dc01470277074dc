"""How much an agent program learns through the OpenAI-compatible endpoint (issue 51, item 3):
the held-out reward of a tiny model trained by GRPO with ``RLTrainer(agent_program=...)``, before
and after, per seed.

The agent is written against the ``openai`` client only (as ``rlhfkit.tasks.tiny.openai_tool_loop``:
each reply sent back as ``message.model_dump(exclude_none=True)``). The task: reverse a word with a
``rev`` tool. The user says ``reverse abcd``; the agent calls ``rev`` with ``{"s": "abcd"}``, gets
``dcba`` back and answers with it. Its reward (``score``): the share of the reversed word's
positions its last reply has right, 0 to 1.

1. Warm start: a fresh tiny ChatML Llama (``chatml_tokenizer``, ``tiny_llama``: 64 wide, 2 layers,
   RoPE base 100; built locally) trained by ``SFTTrainer`` for 1,200 steps of 16 rows on the tool
   conversations of 2,000 words (chat rows with ``tool_calls``, a ``tools`` column). A
   ``--wrong-share`` (half) of them answer at once without the tool, echoing the word (reward 0
   unless letters repeat), so the warm model calls the tool for some words only and copies
   imperfectly: GRPO has something to learn.
2. GRPO through ``agent_program`` for ``--steps`` steps (8 words x 8 episodes, lr 3e-4, no KL; every
   request goes over HTTP to the trainer's endpoint).
3. Measured: the held-out reward, the mean over a fixed set of ``--eval-words`` words no seed trains
   on (``HELD_OUT_SEED``), of greedy episodes of the same program (``eval/agent_program_mean``),
   before the first GRPO step, every ``--eval-every`` steps and after the last; and the training
   reward (sampled, 64 episodes a step).

One JSON line per run (the last line of stdout; SFT prints progress before it): the commit ``import
rlhfkit`` resolved to, the held-out curve and its gain (last - first), the held-out tool-call share,
the training reward per step, wall times. The script adds nothing to ``sys.path``: run it against
another checkout with ``PYTHONPATH=<checkout>``; it uses only APIs that 7241ec1 has too. Measured
at about 3.5 min a run on a loaded 2-core machine (docs/results/endpoint-learning.md):

    export OMP_NUM_THREADS=1
    nice -n 19 .venv/bin/python benchmarks/endpoint_learning.py --seed 0 >> runs.jsonl
    PYTHONPATH=/tmp/wt-7241ec1 nice -n 19 .venv/bin/python benchmarks/endpoint_learning.py --seed 0 >> runs.jsonl
    .venv/bin/python benchmarks/endpoint_learning.py --table runs.jsonl   # per commit: mean, std, min, max

``--out DIR`` keeps the run directory; ``--warm-start DIR/sft/final`` starts GRPO from that SFT model
(the same warm start on two commits).
"""

from __future__ import annotations

import argparse
import json
import random
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

WORD_LENGTH = 4
HELD_OUT_SEED = 12345
# A ChatML template that lists the tools by name (rlhfkit.tasks.calculator_demo's TINY_TOOLS_TEMPLATE,
# copied so that the script needs nothing newer than 7241ec1): episodes fit the tiny model's positions.
TEMPLATE = (
    "{%- if tools %}<|im_start|>system\ntools:{% for t in tools %} {{ t['function']['name'] }}{% endfor %}<|im_end|>\n"
    "{% endif %}{%- for m in messages %}{%- if m['role'] == 'assistant' %}<|im_start|>assistant\n"
    "{{ m['content'] or '' }}{% for c in (m['tool_calls'] or []) %}"
    "<tool_call>{\"name\": \"{{ c['function']['name'] }}\", "
    "\"arguments\": {{ c['function']['arguments'] | tojson }}}</tool_call>{% endfor %}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MODEL = {"hidden_size": 64, "layers": 2, "heads": 4}
SFT = {"learning_rate": 3e-3, "lr_scheduler": "constant", "warmup_steps": 20, "max_steps": 1200, "batch_size": 16}
RL = {
    "algorithm": "grpo",
    "learning_rate": 3e-4,
    "prompts_per_step": 8,
    "group_size": 8,
    "kl_coef": 0.0,
    "max_new_tokens": 112,
}


def rev(s: str) -> str:
    """Reverse a word.

    Args:
        s: The word to reverse.
    """
    return s[::-1]


def tool_schemas() -> list[dict]:
    from transformers.utils import get_json_schema

    return [get_json_schema(rev)]


def score(answer: str, target: str) -> float:
    """The share of ``target``'s positions that ``answer`` has right, over the longer of the two."""
    answer = answer.strip()
    right = sum(a == b for a, b in zip(answer, target))
    return right / max(len(answer), len(target), 1)


def agent(client, row) -> float:
    """The agent program: at most two replies; every ``rev`` call it makes is run and its result sent
    back; the reward scores the last reply's text against the reversed word."""
    messages = [{"role": "user", "content": row["prompt"]}]
    for _ in range(2):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=tool_schemas())
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))  # sent back as the client returns it
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            try:
                result = rev(str(json.loads(call.function.arguments)["s"]))
            except (ValueError, KeyError, TypeError) as err:
                result = f"error: {type(err).__name__}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    last = messages[-1]
    return score((last.get("content") or "") if last["role"] == "assistant" else "", row["target"])


def words(n: int, rng: random.Random, exclude=frozenset()) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        w = "".join(rng.choice(string.ascii_lowercase) for _ in range(WORD_LENGTH))
        if w not in exclude and w not in out:
            out.append(w)
    return out


def prompt_row(word: str) -> dict:
    return {"prompt": f"reverse {word}", "target": word[::-1]}


def sft_rows(train_words: list[str], wrong_share: float, rng: random.Random) -> list[dict]:
    """Tool conversations (the call, the tool's result, the final answer); a ``wrong_share`` of them
    answer at once without the tool, echoing the word."""
    rows = []
    for w in train_words:
        if rng.random() < wrong_share:
            turns = [{"role": "assistant", "content": w}]
        else:
            call = {"type": "function", "function": {"name": "rev", "arguments": {"s": w}}}
            turns = [
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "name": "rev", "content": w[::-1]},
                {"role": "assistant", "content": w[::-1]},
            ]
        rows.append({"messages": [{"role": "user", "content": f"reverse {w}"}, *turns], "tools": tool_schemas()})
    return rows


def commit_of(module) -> str:
    """The commit (and ``+dirty``) of the checkout ``module`` was imported from."""
    root = Path(module.__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "rlhfkit"],
            capture_output=True,
            text=True,
        )
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except OSError:
        return "unknown"


def tiny_llama(tokenizer, seed: int):
    """``rlhfkit.tasks.tiny.tiny_causal_lm``'s Llama with RoPE base 100 (not 10,000): with it the tiny
    model learns to copy the word into its call within a few hundred SFT steps (at base 10,000, in most
    tries with 400-700 steps it had not)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=MODEL["hidden_size"],
        intermediate_size=MODEL["hidden_size"] * 2,
        num_hidden_layers=MODEL["layers"],
        num_attention_heads=MODEL["heads"],
        num_key_value_heads=MODEL["heads"],
        max_position_embeddings=256,
        rope_theta=100.0,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def warm_start(out: Path, seed: int, wrong_share: float, train_words: list[str], **sft) -> str:
    from rlhfkit.config.supervised import SFTConfig
    from rlhfkit.tasks.tiny import chatml_tokenizer
    from rlhfkit.trainers import SFTTrainer

    tokenizer = chatml_tokenizer()
    model = tiny_llama(tokenizer, seed)
    rows = sft_rows(train_words, wrong_share, random.Random(seed))
    args = SFTConfig(
        output_dir=str(out / "sft"),
        chat_template=str(out / "template.jinja"),
        seed=seed,
        log_every=50,
        max_length=256,
        **{**SFT, **sft},
    )
    SFTTrainer(model, args, train_dataset=rows, processing_class=tokenizer).train()
    return str(out / "sft" / "final")


def train_agent(model_dir: str, out: Path, seed: int, train_words, held_out, steps: int, eval_every: int, **rl):
    from rlhfkit import RLConfig, RLTrainer

    config = RLConfig(
        output_dir=str(out / "grpo"),
        chat_template=str(out / "template.jinja"),
        seed=seed,
        max_steps=steps,
        eval_every=eval_every,
        save_steps=0,
        log_every=0,
        **{**RL, **rl},
    )
    trainer = RLTrainer(
        model_dir,
        [],
        config,
        [prompt_row(w) for w in train_words],
        eval_dataset=[prompt_row(w) for w in held_out],
        agent_program=agent,
    )
    return trainer.train()


def summary(history: list[dict]) -> dict:
    """The held-out curve ([step, reward]), its gain, the held-out tool-call share and the training reward."""
    curve = [
        [int(r.get("step", 0)), round(r["eval/agent_program_mean"], 4)]
        for r in history
        if "eval/agent_program_mean" in r
    ]
    train = [round(r["reward/mean"], 4) for r in history if "reward/mean" in r]
    return {
        "held_out": curve,
        "gain": round(curve[-1][1] - curve[0][1], 4) if curve else None,
        "held_out_tool_calls": [round(r["eval/tool_calls_mean"], 3) for r in history if "eval/tool_calls_mean" in r],
        "train_reward": train,
        "train_first5_last5": [round(sum(train[:5]) / 5, 4), round(sum(train[-5:]) / 5, 4)]
        if len(train) >= 5
        else None,
    }


def table(paths: list[str]) -> None:
    """The runs' lines in ``paths`` as two Markdown tables: per run, and per commit and warm start
    (its own SFT, or a shared ``--warm-start``) the held-out gain's mean, standard deviation, min and
    max over seeds. A seed run again on the same commit and warm start is counted once (and said
    whether it repeated the first run exactly)."""
    import statistics

    groups: dict[tuple, dict[int, dict]] = {}
    repeats = []
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            seeds = groups.setdefault((r["commit"], "shared" if r.get("warm_start") else "own"), {})
            if r["seed"] in seeds:
                same = (
                    seeds[r["seed"]]["train_reward"] == r["train_reward"]
                    and seeds[r["seed"]]["held_out"] == r["held_out"]
                )
                repeats.append(f"{r['commit']} seed {r['seed']}: {'identical' if same else 'different'}")
            else:
                seeds[r["seed"]] = r
    print(
        "| commit | warm start | seed | held-out start | end | gain | tool calls | training reward | SFT s | GRPO s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for (commit, warm), seeds in sorted(groups.items()):
        for seed, r in sorted(seeds.items()):
            calls, train = r["held_out_tool_calls"], r["train_first5_last5"] or [0.0, 0.0]
            print(
                f"| {commit} | {warm} | {seed} | {r['held_out'][0][1]:.3f} | {r['held_out'][-1][1]:.3f} | "
                f"{r['gain']:+.3f} | {calls[0]:.2f} → {calls[-1]:.2f} | {train[0]:.3f} → {train[1]:.3f} | "
                f"{r['sft_s']} | {r['grpo_s']} |"
            )
    print("\n| commit | warm start | seeds | held-out start | held-out end | gain: mean | std | min | max |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for (commit, warm), seeds in sorted(groups.items()):
        rs = [seeds[k] for k in sorted(seeds)]
        start, end = ([r["held_out"][i][1] for r in rs] for i in (0, -1))
        gain = [r["gain"] for r in rs]
        std = statistics.stdev(gain) if len(gain) > 1 else 0.0
        print(
            f"| {commit} | {warm} | {len(rs)} | {statistics.mean(start):.3f} | {statistics.mean(end):.3f} | "
            f"{statistics.mean(gain):+.3f} | {std:.3f} | {min(gain):+.3f} | {max(gain):+.3f} |"
        )
    if repeats:
        print("\nrepeated runs: " + "; ".join(repeats))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=30, help="GRPO steps")
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--eval-words", type=int, default=64, help="held-out words (a fixed set, every seed)")
    parser.add_argument("--train-words", type=int, default=2000)
    parser.add_argument("--sft-steps", type=int, default=SFT["max_steps"])
    parser.add_argument("--sft-lr", type=float, default=SFT["learning_rate"])
    parser.add_argument("--rl-lr", type=float, default=RL["learning_rate"])
    parser.add_argument("--model", default=None, help="hidden_size,layers,heads of the tiny model")
    parser.add_argument("--wrong-share", type=float, default=0.5, help="SFT conversations that echo the word")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument(
        "--warm-start", default=None, help="start GRPO from this SFT model directory (OUT/sft/final of an earlier run)"
    )
    parser.add_argument("--out", default=None, help="run directory (default: a temporary one, removed)")
    parser.add_argument("--table", nargs="+", metavar="JSONL", help="summarise earlier runs' lines; run nothing")
    args = parser.parse_args(argv)
    if args.table:
        return table(args.table)
    torch.set_num_threads(args.threads)
    if args.model:
        MODEL.update(zip(("hidden_size", "layers", "heads"), map(int, args.model.split(","))))

    import rlhfkit

    held_out = words(args.eval_words, random.Random(HELD_OUT_SEED))
    train_words = words(args.train_words, random.Random(args.seed), exclude=frozenset(held_out))
    with tempfile.TemporaryDirectory(prefix="endpoint-learning-") as tmp:
        out = Path(args.out or tmp)
        out.mkdir(parents=True, exist_ok=True)
        (out / "template.jinja").write_text(TEMPLATE)
        start = time.perf_counter()
        model_dir = args.warm_start or warm_start(
            out, args.seed, args.wrong_share, train_words, max_steps=args.sft_steps, learning_rate=args.sft_lr
        )
        sft_s = time.perf_counter() - start
        history = train_agent(
            model_dir, out, args.seed, train_words, held_out, args.steps, args.eval_every, learning_rate=args.rl_lr
        )
        grpo_s = time.perf_counter() - start - sft_s
    result = {"commit": commit_of(rlhfkit), "rlhfkit": str(Path(rlhfkit.__file__).resolve().parent)}
    result.update(seed=args.seed, steps=args.steps, warm_start=args.warm_start, **summary(history))
    result.update(sft_s=round(sft_s), grpo_s=round(grpo_s), python=sys.version.split()[0], torch=torch.__version__)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
