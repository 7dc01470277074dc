"""The ``rlhfkit`` commands that train nothing: ``eval`` (score a policy on a prompt set), ``quickstart``,
``report``, ``data`` (write an embedded task's files) and ``demo``. ``cli.py`` parses their options and calls
them with the parsed ``args``; each returns the exit status and raises ``ValueError`` (one line) on bad input."""

from __future__ import annotations

import sys
from pathlib import Path


def eval_command(args) -> int:
    """``rlhfkit eval``: score a policy (a model directory, a .gguf file or a checkpoint) on a prompt set with
    reward functions and reward models; print the metrics and, with ``--output``, write them and the samples."""
    from .data import load_prompt_dataset
    from .jobs import check_eval_output, checkpoint_policy, write_eval_output
    from .rl.evaluate import check_eval_sizes, evaluate_policy
    from .rollout import SamplingParams

    check_eval_sizes(args.samples, args.batch_size, ("--samples", "--batch-size"))
    if args.output:
        check_eval_output(
            args.output,
            args.overwrite,
            {"--dataset": args.dataset, "--model": args.model, "--reference": args.reference},
        )
    if not args.reward:
        raise ValueError("eval needs at least one --reward (a registered name, module:function, or reward-model dir)")
    given = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature}
    try:
        sampling = SamplingParams(**{k: v for k, v in given.items() if v is not None}, greedy=args.greedy)
    except ValueError as err:  # name the flag, not the field
        flag = next(f"--{k.replace('_', '-')}" for k in given if f"'{k}'" in str(err))
        raise ValueError(f"{flag} must {str(err).split(' must ', 1)[1]}") from None
    load_prompt_dataset(args.dataset, name="eval dataset")  # data errors before any model is loaded
    from .agents.tools import import_object

    tools = [import_object(path, "--tool") for path in args.tool]
    environment = import_object(args.environment, "--environment") if args.environment else None
    model, tokenizer = checkpoint_policy(args.model) or (args.model, None)
    result = evaluate_policy(
        model,
        args.reward,
        args.dataset,
        tokenizer=tokenizer,
        reference=args.reference,
        samples_per_prompt=args.samples,
        sampling=sampling,
        batch_size=args.batch_size,
        tools=tools,
        environment_factory=environment,
        chat_template=args.chat_template,
        max_tool_calling_iterations=args.max_tool_calling_iterations,
    )
    for key, value in result["metrics"].items():
        print(f"{key:<32} {value:10.4f}")
    if args.output:
        write_eval_output(args.output, result)
    return 0


def quickstart_command(args) -> int:
    """``rlhfkit quickstart``: SFT, reward model, PPO (and GRPO, DPO, a distilled student) on the shift task; exit
    status 1 unless
    PPO raised the oracle score."""
    from .quickstart import run_quickstart

    out = run_quickstart(
        args.output_dir,
        scale=args.scale,
        compare_grpo=not args.no_grpo,
        quiet=args.quiet,
        seed=args.seed,
        overwrite=args.overwrite,
        compare_dpo=not args.no_dpo,
        distill=not args.no_distill,
    )
    before = out["results"]["SFT"]["eval/oracle_reward_mean"]
    after = out["results"]["PPO"]["eval/oracle_reward_mean"]
    if after <= before:
        print(f"quickstart failed: PPO did not raise the oracle score ({before:.3f} -> {after:.3f})", file=sys.stderr)
        return 1
    return 0


def report_command(args) -> int:
    """``rlhfkit report``: regenerate the plots and ``report.html`` of run directories."""
    from .report import find_runs, write_report
    from .run.trace import merge

    for run in find_runs(args.run_dir):  # one line names a folder without runs
        merge(run, remove=False)  # the timeline of a run that did not finish (or still runs)
    print(write_report(args.run_dir))
    return 0


def data_command(args) -> int:
    """``rlhfkit data``: write an embedded task's files (shift, arithmetic or calculator) into ``args.out_dir``."""
    from .tasks import arithmetic, calculator, shift

    existing = [
        p
        for p in (
            "sft.jsonl",
            "pairs.jsonl",
            "prompts.jsonl",
            "eval_prompts.jsonl",
            "model",
            "train.jsonl",
            "eval.jsonl",
        )
        if (Path(args.out_dir) / p).exists()
    ]
    _check_count("--n-train", args.n_train, 1, 10**7)
    if existing and not args.overwrite:
        raise ValueError(f"{args.out_dir} already holds {', '.join(existing)}: choose another directory or --overwrite")
    if args.task == "arithmetic":
        train_digits = [int(d) for d in args.train_digits.split(",")] if args.train_digits else None
        paths = arithmetic.write_task_files(
            args.out_dir,
            args.seed,
            n_train=args.n_train,
            digits=args.digits,
            operators=args.operators,
            train_digits=train_digits,
        )
    elif args.task == "calculator":
        try:
            digits = tuple(int(d) for d in args.factor_digits.split(","))
        except ValueError:
            digits = ()
        if len(digits) != 2 or min(digits) < 1:
            raise ValueError(f"--factor-digits must be two positive integers like '3,2', got {args.factor_digits!r}")
        if not 0.0 <= args.wrong_share <= 1.0:
            raise ValueError(f"--wrong-share must be in [0, 1], got {args.wrong_share}")
        paths = calculator.write_task_files(
            args.out_dir, args.seed, n_train=args.n_train, digits=digits, wrong_share=args.wrong_share
        )
    else:
        paths = shift.write_task_files(args.out_dir, args.seed)
    for name, path in paths.items():
        print(f"{name:<20} {path}")
    return 0


def demo_command(args) -> int:
    """``rlhfkit demo``: every preset on a sequence bandit with a known optimum; exit status 1 unless each
    finds it."""
    from .tasks.bandit import BANDIT_PRESETS, train_bandit

    _check_count("--steps", args.steps, 1, 10**6)
    print("Sequence bandit (4 positions x 6 tokens, hidden target; reward = fraction matched)")
    print(f"{'algorithm':<10} {'reward start':>12} {'reward end':>10}  optimum found")
    failed = False
    for name in BANDIT_PRESETS:
        r = train_bandit(name, steps=args.steps, seed=args.seed)
        failed |= not r.optimal
        print(f"{name:<10} {r.reward_start:>12.3f} {r.reward_end:>10.3f}  {'yes' if r.optimal else 'NO'}")
    return 1 if failed else 0


def _check_count(flag: str, value: int, low: int, high: int) -> None:
    """Refuse, in one line naming ``flag``, a count outside ``[low, high]``."""
    if not low <= value <= high:
        raise ValueError(f"{flag} must be an integer in [{low}, {high}], got {value}")
