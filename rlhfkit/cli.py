"""The ``rlhfkit`` command."""

from __future__ import annotations

import argparse
import sys


def _demo(args: argparse.Namespace) -> int:
    from .tasks.bandit import BANDIT_PRESETS, train_bandit

    print("Sequence bandit (4 positions x 6 tokens, hidden target; reward = fraction matched)")
    print(f"{'algorithm':<10} {'reward start':>12} {'reward end':>10}  optimum found")
    failed = False
    for name in BANDIT_PRESETS:
        r = train_bandit(name, steps=args.steps, seed=args.seed)
        failed |= not r.optimal
        print(f"{name:<10} {r.reward_start:>12.3f} {r.reward_end:>10.3f}  {'yes' if r.optimal else 'NO'}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlhfkit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="train PPO / GRPO / REINFORCE / RLOO on a bandit with a known optimum")
    demo.add_argument("--steps", type=int, default=60, help="training steps per algorithm (default 60)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.set_defaults(func=_demo)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
