"""Agent episodes per second through the OpenAI-compatible endpoint (``RLTrainer(agent_program=)``:
the program talks to the policy with the ``openai`` client over HTTP) against the same episodes run
in process (``environment_factory=``), on the same tiny model, alternated A/B in one process.

    python benchmarks/endpoint_episodes.py                    # 64 episodes (8 prompts x 8), 3 turns each
    python benchmarks/endpoint_episodes.py --episodes 16 --rounds 5 --turns 1

Both paths do the same work: a random tiny ChatML model whose turns end early, every turn read as
a call of the ``add`` tool (the parser is replaced in both paths, as tests/agents/test_token_fidelity.py
does, so episodes have ``--turns`` turns whatever the random model writes), the tool run, its result
sent back. Each path's time is split into ``engine.generate`` (the same batches: all running
episodes per turn) and the rest: for the endpoint, HTTP, JSON, the client, threads and the batching
queue; in process, parsing and tool suffixes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlhfkit.tasks.tiny import add, openai_tool_loop  # noqa: E402  (after the path: run from a clone)

TURNS = 3
CALL = {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}


class Timed:
    """An engine wrapper that adds up the time and calls of ``generate``."""

    def __init__(self, engine):
        self.engine, self.seconds, self.calls, self.needs_sync = engine, 0.0, 0, False

    def generate(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self.engine.generate(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1

    def sleep(self):
        pass


def program(client, row):
    """The agent, written against the openai client only (``TURNS`` replies at most, as
    max_tool_calling_iterations = TURNS - 1 in process)."""
    return openai_tool_loop(client, row, (add,), max_turns=TURNS)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3, help="turns per episode (tool rounds + 1)")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens a turn may sample")
    parser.add_argument("--rounds", type=int, default=3, help="A/B rounds after one warm-up round each")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    global TURNS
    TURNS = args.turns

    import rlhfkit.agents.episode as episode_module
    import rlhfkit.endpoint.sampling as endpoint_sampling
    from rlhfkit.agents.agent import Agent
    from rlhfkit.agents.episode import AgentOptions
    from rlhfkit.endpoint import ProgramAgent
    from rlhfkit.rollout import HFEngine
    from rlhfkit.rollout.base import SamplingParams
    from rlhfkit.tasks.calculator_demo import TINY_TOOLS_TEMPLATE
    from rlhfkit.tasks.tiny import chatml_tokenizer

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "endpoint"))
    from conftest import turn_ending_model

    always = lambda text, tokenizer=None, tools=None: (text, [CALL])  # noqa: E731 — every turn calls add
    episode_module.parse_tool_calls = endpoint_sampling.parse_tool_calls = always
    tok = chatml_tokenizer()
    tok.chat_template = TINY_TOOLS_TEMPLATE
    model = turn_ending_model(tok).eval()
    engine = Timed(HFEngine(model, tok.pad_token_id, tok.eos_token_id))
    prompts = args.episodes // args.group_size
    rows = [{"prompt": f"{i}+{i}?"} for i in range(prompts)]
    budget = args.turns * (args.new_tokens + 24)
    sampling = SamplingParams(max_new_tokens=budget, temperature=1.0)
    in_process = Agent(tok, tools=[add], options=AgentOptions(max_tool_calling_iterations=args.turns - 1))
    endpoint = ProgramAgent(program, tok)

    def once(name, agent, seed):
        engine.seconds, engine.calls = 0.0, 0
        episodes = agent.start(rows, range(prompts), args.group_size)
        start = time.perf_counter()
        _, episodes = agent.run(engine, episodes, sampling, seed=list(range(seed, seed + len(episodes))))
        wall = time.perf_counter() - start
        turns = sum(e.turns for e in episodes) / len(episodes)
        return {
            "path": name,
            "wall_s": wall,
            "episodes_per_s": len(episodes) / wall,
            "generate_s": engine.seconds,
            "generate_calls": engine.calls,
            "other_s": wall - engine.seconds,
            "turns_mean": turns,
        }

    results = {"endpoint": [], "environment_factory": []}
    try:
        for r in range(args.rounds + 1):
            for name, agent in (("environment_factory", in_process), ("endpoint", endpoint)):
                row = once(name, agent, 1000 * r)
                if r:  # round 0 warms up (imports, the server's start)
                    results[name].append(row)
                    print(
                        json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True
                    )
    finally:
        endpoint.close()
    med = {
        k: {m: statistics.median(x[m] for x in v) for m in ("wall_s", "episodes_per_s", "generate_s", "other_s")}
        for k, v in results.items()
    }
    ratio = med["endpoint"]["wall_s"] / med["environment_factory"]["wall_s"]
    print(
        f"median over {args.rounds} rounds: endpoint {med['endpoint']['episodes_per_s']:.1f} episodes/s "
        f"(generate {med['endpoint']['generate_s']:.2f} s + other {med['endpoint']['other_s']:.2f} s), "
        f"in process {med['environment_factory']['episodes_per_s']:.1f} episodes/s "
        f"(generate {med['environment_factory']['generate_s']:.2f} s + other "
        f"{med['environment_factory']['other_s']:.2f} s); endpoint / in-process time = {ratio:.2f}x"
    )


if __name__ == "__main__":
    main()
