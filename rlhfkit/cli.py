"""The ``rlhfkit`` command: ``quickstart``, ``sft``, ``rm``, ``dpo``, ``kto``, ``rl``, ``eval``, ``report``, ``data``,
``demo``.

Training commands take ``--config recipe.yaml`` and ``key=value`` overrides; ``--help`` lists every
key with its documentation (``config/io.py:format_help``). This module parses the command line and runs
the training commands; the others (``eval``, ``quickstart``, ``report``, ``data``, ``demo``) are in
``commands.py``. Bad input is one line on stderr and exit status 2 (``--traceback`` or
``RLHFKIT_TRACEBACK=1``: after its traceback; ``run/errors.py``).
"""

from __future__ import annotations

import argparse
import difflib
import re
import signal
import sys
from typing import Any

from . import commands
from .run import errors, interrupts


def _train(job_cls, args, run) -> int:
    from .config.io import format_help, load_config

    if args.help:
        print(
            f"usage: rlhfkit {args.command} [--config FILE.yaml] [key=value ...] [--quiet] [--overwrite] "
            "[--nproc-per-node N] [--traceback]\n"
        )
        print((job_cls.__doc__ or "").strip() + "\n\nkeys:\n" + format_help(job_cls))
        return 0
    overrides = list(args.overrides)
    if args.quiet:
        overrides.append("progress_bar=false")
    if args.overwrite:
        overrides.append("overwrite=true")
    job = load_config(job_cls, args.config, overrides)  # config errors before any process starts
    args.job_config = job  # what an interrupt's line names (run/interrupts.py)
    from . import distributed

    if hasattr(job, "check_processes") and not distributed.under_torchrun():
        job.check_processes(args.nproc_per_node)  # e.g. rollout_workers that leave no trainer
    if args.nproc_per_node > 1 and not distributed.under_torchrun():
        return _torchrun(args.nproc_per_node, args.argv)
    run(job).train()  # the trainer records the whole job in the run directory (run.record.record_run)
    return 0


def _torchrun(nproc: int, argv: list[str]) -> int:
    """This very command again under ``torchrun --standalone --nproc-per-node N`` (one machine; for
    several, run torchrun yourself with --nnodes/--node-rank/--rdzv-endpoint: see the README), in
    its own process group: Ctrl-C and SIGTERM reach it through this command (``interrupts.supervise``)."""
    kept, skip = [], False
    for arg in argv:  # drop --nproc-per-node N / --nproc-per-node=N
        if skip:
            skip = False
        elif arg == "--nproc-per-node":
            skip = True
        elif not arg.startswith("--nproc-per-node="):
            kept.append(arg)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "rlhfkit",
        *kept,
    ]
    return interrupts.supervise(command, argv)


def _datasets(job) -> tuple[Any, Any]:
    """The job's train and eval datasets: local paths as given, Hub ids loaded with the job's
    ``dataset_subset`` and splits."""
    from .data.hub import resolve_dataset

    train = resolve_dataset(job.train_dataset, job.dataset_subset, job.dataset_train_split, "train_dataset")
    evaluation = (
        resolve_dataset(job.eval_dataset, job.dataset_subset, job.dataset_eval_split, "eval_dataset")
        if job.eval_dataset
        else None
    )
    return train, evaluation


def _run_sft(job):
    from .jobs import lora_config, require, trainer_config
    from .trainers import SFTConfig, SFTTrainer

    require(job, "model", "train_dataset")
    return SFTTrainer(job.model, trainer_config(job, SFTConfig), *_datasets(job), peft_config=lora_config(job))


def _run_rm(job):
    from .jobs import lora_config, require, trainer_config
    from .trainers import RewardModelConfig, RewardModelTrainer

    require(job, "model", "train_dataset")
    return RewardModelTrainer(
        job.model,
        trainer_config(job, RewardModelConfig),
        *_datasets(job),
        center_dataset=job.center_dataset,
        peft_config=lora_config(job),
    )


def _run_dpo(job):
    from .jobs import lora_config, require, trainer_config
    from .trainers import DPOConfig, DPOTrainer

    require(job, "model", "train_dataset")
    return DPOTrainer(
        job.model,
        trainer_config(job, DPOConfig),
        *_datasets(job),
        ref_model=job.ref_model,
        peft_config=lora_config(job),
    )


def _run_kto(job):
    from .jobs import lora_config, require, trainer_config
    from .trainers import KTOConfig, KTOTrainer

    require(job, "model", "train_dataset")
    train, evaluation = _datasets(job)
    return KTOTrainer(
        job.model,
        trainer_config(job, KTOConfig),
        train,
        evaluation,
        ref_model=job.ref_model,
        peft_config=lora_config(job),
    )


def _run_rl(job):
    from .config import RLConfig
    from .jobs import lora_config, require, trainer_config
    from .trainers import RLTrainer

    require(job, "model", "train_dataset", "reward_funcs")
    train, evaluation = _datasets(job)
    from .agents.tools import import_object

    tools = [import_object(path, "tools") for path in job.tools]
    environment = import_object(job.environment, "environment") if job.environment else None
    return RLTrainer(
        job.model,
        list(job.reward_funcs),
        trainer_config(job, RLConfig),
        train,
        eval_dataset=evaluation,
        reward_weights=list(job.reward_weights) if job.reward_weights else None,
        peft_config=lora_config(job),
        ref_model=job.ref_model,
        tools=tools or None,
        environment_factory=environment,
    )


class _OneLineParser(argparse.ArgumentParser):
    """argparse, whose errors are one line on stderr (exit status 2) without the usage block before them;
    ``--help`` still prints the usage. Subcommands' parsers are of this class too (argparse's default)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    from .config.rollout import AgentConfig

    # allow_abbrev=False everywhere: no option is ever taken from a prefix (`--over` is not
    # --overwrite); main refuses an unknown one in one line with a suggestion (_unknown_options).
    parser = _OneLineParser(prog="rlhfkit", description="RL post-training of language models.", allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    q = sub.add_parser(
        "quickstart",
        allow_abbrev=False,
        help="SFT -> reward model -> PPO (and GRPO, DPO, distillation) on a synthetic task, on CPU",
    )
    q.add_argument("--output-dir", default="runs/quickstart", help="run directory (default runs/quickstart)")
    q.add_argument("--scale", type=float, default=1.0, help="multiply every stage's steps and data (default 1)")
    q.add_argument("--no-grpo", action="store_true", help="skip the GRPO comparison")
    q.add_argument("--no-dpo", action="store_true", help="skip the DPO comparison")
    q.add_argument("--no-distill", action="store_true", help="skip distilling the PPO policy into a smaller student")
    q.add_argument("--seed", type=int, default=0)
    for p in (q,):
        p.add_argument("--quiet", action="store_true", help="log lines only, no progress bars")
        p.add_argument("--overwrite", action="store_true", help="reuse an existing output directory")
    q.set_defaults(func=commands.quickstart_command)
    for name, job in (("sft", "SFTJob"), ("rm", "RMJob"), ("dpo", "DPOJob"), ("kto", "KTOJob"), ("rl", "RLJob")):
        t = sub.add_parser(
            name, add_help=False, allow_abbrev=False, help=f"train ({name}); --help lists every config key"
        )
        t.add_argument("--config", help="YAML file of config keys")
        t.add_argument("overrides", nargs="*", help="key=value overrides")
        t.add_argument("--quiet", action="store_true", help="log lines only, no progress bar")
        t.add_argument("--overwrite", action="store_true", help="allow an existing, non-empty output_dir")
        t.add_argument(
            "--nproc-per-node",
            type=int,
            default=1,
            help="processes on this machine: starts torchrun with this many (CPU: gloo; GPU: one per GPU)",
        )
        t.add_argument("-h", "--help", action="store_true")
        t.set_defaults(func=None, job=job)
    e = sub.add_parser(
        "eval", allow_abbrev=False, help="score a policy on a prompt set with reward functions / reward models"
    )
    e.add_argument(
        "--model",
        required=True,
        help="policy: a model directory, .gguf file, package:NAME/file, or an `rlhfkit rl` checkpoint-N directory",
    )
    e.add_argument("--dataset", required=True, help="prompts file (.jsonl/.json/.parquet, 'prompt' column)")
    e.add_argument("--reward", action="append", default=[], help="reward source (repeatable)")
    e.add_argument("--reference", help="reference model directory: report the KL to it")
    e.add_argument("--samples", type=int, default=1, help="completions per prompt")
    e.add_argument("--max-new-tokens", type=int, help="response length limit (default: RL's max_new_tokens default)")
    e.add_argument("--temperature", type=float, help="sampling temperature (default: RL's, 1.0)")
    e.add_argument("--greedy", action="store_true", help="greedy decoding instead of sampling")
    e.add_argument("--batch-size", type=int, default=64, help="completions generated at once (default 64)")
    e.add_argument("--output", help="write metrics and samples to this JSON file")
    e.add_argument(
        "--tool", action="append", default=[], help="agents: a tool the model may call, as module:function (repeatable)"
    )
    e.add_argument("--environment", help="agents: an environment class as module:Class, one per sample")
    e.add_argument("--chat-template", help="a chat template: a file, inline Jinja or a shipped name (chatml_tools)")
    e.add_argument(
        "--max-tool-calling-iterations",
        type=int,
        default=AgentConfig.max_tool_calling_iterations,  # the config field's default, declared once
        help="agents: tool rounds per episode",
    )
    e.add_argument(
        "--overwrite", action="store_true", help="replace an existing --output file that is not an earlier eval result"
    )
    e.set_defaults(func=commands.eval_command)
    r = sub.add_parser("report", allow_abbrev=False, help="regenerate a run directory's plots and report.html")
    r.add_argument("run_dir", nargs="+", help="run directories or folders of runs (overlaid in one report)")
    r.set_defaults(func=commands.report_command)
    d = sub.add_parser(
        "data",
        allow_abbrev=False,
        help="write an embedded task's files (shift: tiny model, SFT data, pairs, prompts; "
        "arithmetic: train/eval questions; calculator: products, with tool-use SFT conversations)",
    )
    d.add_argument("out_dir")
    d.add_argument("--task", choices=["shift", "arithmetic", "calculator"], default="shift")
    d.add_argument("--digits", type=int, default=2, help="arithmetic: digits per operand")
    d.add_argument("--operators", default="+", help="arithmetic: operators to use, e.g. '+-'")
    d.add_argument("--n-train", type=int, default=2000, help="arithmetic: questions in the training split")
    d.add_argument(
        "--train-digits", help="arithmetic: digits mix of the training split, e.g. '1,2' (default: --digits)"
    )
    d.add_argument("--factor-digits", default="2,2", help="calculator: digits of the two factors, e.g. '3,2'")
    d.add_argument(
        "--wrong-share",
        type=float,
        default=0.0,
        help="calculator: share of SFT conversations that end with a wrong answer (default 0)",
    )
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--overwrite", action="store_true", help="replace the task's files if they exist")
    d.set_defaults(func=commands.data_command)
    demo = sub.add_parser(
        "demo", allow_abbrev=False, help="PPO / GRPO / REINFORCE / RLOO on a bandit with a known optimum"
    )
    demo.add_argument("--steps", type=int, default=60, help="training steps per algorithm (default 60)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.set_defaults(func=commands.demo_command)
    __import__("rlhfkit.serving", fromlist=["add_command"]).add_command(sub)  # rlhfkit serve: rlhfkit/serving.py
    for command in sub.choices.values():  # every command's: run/errors.py (RLHFKIT_TRACEBACK=1 does the same)
        command.add_argument("--traceback", action="store_true", help="print the traceback before a one-line error")
    return parser


def main(argv: list[str] | None = None) -> int:
    if hasattr(signal, "SIGPIPE") and argv is None:  # `rlhfkit ... | head` ends quietly, like other CLIs
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    tokens = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    refused = _unknown_options(parser, tokens)  # before anything is read or written
    if refused:
        print(refused, file=sys.stderr)
        return 2
    args, extra = parser.parse_known_args(tokens)
    if (
        extra
        and getattr(args, "overrides", None) is not None
        and all("=" in e and not e.startswith("-") for e in extra)
    ):
        args.overrides = [*args.overrides, *extra]  # key=value after an option: `rl --quiet kl_coef=0.1 ...`
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.argv, args.job_config = tokens, None
    with interrupts.handlers():  # Ctrl-C / SIGTERM: one line, exit 130 / 143 (run/interrupts.py)
        try:
            return _run(args)
        except BaseException:
            if interrupts.received() is None:
                raise
        return interrupts.report(args.command, args.argv, args.job_config)


def _run(args) -> int:
    try:
        args.traceback = errors.traceback_wanted(args.traceback)  # --traceback or RLHFKIT_TRACEBACK=1
        import transformers

        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()
        from . import tasks  # noqa: F401  (registers the embedded tasks' reward functions)
        from .tasks import shift  # noqa: F401

        if args.func is None:
            from . import jobs

            runners = {"sft": _run_sft, "rm": _run_rm, "dpo": _run_dpo, "kto": _run_kto, "rl": _run_rl}
            return _train(getattr(jobs, args.job), args, runners[args.command])
        return args.func(args)
    except (ValueError, OSError) as err:  # OSError: disk full, read-only, not a directory, ... (its path named)
        if interrupts.received() is not None:  # a failure the interrupt caused: its one line instead
            raise
        return errors.report_error(args.command, err, args.traceback)  # one line (--traceback: after its traceback)


_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # argparse takes these for values, not options


def _unknown_options(parser: argparse.ArgumentParser, tokens: list[str]) -> str | None:
    """The one-line refusal of every option that is not one of its command's, exactly as spelt
    (``--overwrit``, ``--over``, ``--overwrit=true``: never a prefix of a real one), with the real
    one it may mean; None when there is none. Tokens are read as argparse reads them: a token
    starting with '-' is an option unless it is '-', a negative number or holds a space; after
    '--' none is."""
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    current, prog, unknown = parser, parser.prog, []
    for token in tokens:
        if token == "--":
            break
        if current is parser and token in commands:
            current, prog = commands[token], f"{parser.prog} {token}"
        elif token.startswith("-") and token != "-" and not _NUMBER.match(token) and " " not in token:
            flag = token.split("=", 1)[0]
            if flag not in current._option_string_actions and flag not in unknown:
                unknown.append(flag)
    if not unknown:
        return None
    known = sorted(current._option_string_actions)
    named = [flag + _did_you_mean(flag, known) for flag in unknown]
    return f"{prog}: error: unrecognized option{'s' if len(named) > 1 else ''} {', '.join(named)}"


def _did_you_mean(flag: str, known: list[str]) -> str:
    close = [k for k in known if k.startswith(flag) and len(flag) > 2] or difflib.get_close_matches(flag, known, n=1)
    return f" (did you mean {' or '.join(close[:3])}?)" if close else ""


if __name__ == "__main__":
    sys.exit(main())
