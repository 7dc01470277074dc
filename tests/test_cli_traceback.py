"""A reward function that raises: the command's one line ends with where it raised in the user's
own file — ``(my_module.py:N in fn)``, the innermost frame of that file, not rlhfkit's, the standard
library's or site-packages' — and ``--traceback`` (on every command) or ``RLHFKIT_TRACEBACK=1``
prints the full traceback before that line. Through the real command line, as a user types it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlhfkit.cli import _parser, main

RLHFKIT = str(Path(sys.executable).parent / "rlhfkit")  # the console script in this environment
# Line 4 (parse) raises, inside the standard library's json: the line named is the user's call, line 4.
MODULE = """import json


def parse(text):
    return json.loads(text)


def score(prompts, completions, **kwargs):
    return [float(parse(c)) for c in completions]
"""
RAISING_LINE = 5


@pytest.fixture()
def recipe(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["data", "d"]) == 0
    capsys.readouterr()
    (tmp_path / "my_module.py").write_text(MODULE)
    assert MODULE.splitlines()[RAISING_LINE - 1].strip() == "return json.loads(text)"
    path = tmp_path / "recipe.yaml"
    path.write_text(
        "model: d/model\ntrain_dataset: d/prompts.jsonl\nreward_funcs: ['my_module:score']\n"
        "max_steps: 1\nmax_new_tokens: 4\nprompts_per_step: 2\noutput_dir: run\n"
    )
    return path


def _rlhfkit(*argv, **env):
    environ = {k: v for k, v in os.environ.items() if k != "RLHFKIT_TRACEBACK"}
    return subprocess.run(
        [RLHFKIT, *argv], capture_output=True, text=True, timeout=300, env={**environ, "OMP_NUM_THREADS": "1", **env}
    )


def test_the_one_line_ends_with_the_users_file_and_line(recipe):
    out = _rlhfkit("rl", "--config", str(recipe), "--quiet")
    assert out.returncode == 2, out.stderr[-3000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert lines[0].startswith("rlhfkit rl: error: reward function 'score' raised JSONDecodeError: ")
    assert lines[0].endswith(f"(my_module.py:{RAISING_LINE} in parse)"), lines[0]


@pytest.mark.parametrize("switch", ["flag", "env"])
def test_the_switch_prints_the_full_traceback(recipe, switch):
    out = _rlhfkit(
        "rl",
        "--config",
        str(recipe),
        "--quiet",
        *(["--traceback"] if switch == "flag" else []),
        **({"RLHFKIT_TRACEBACK": "1"} if switch == "env" else {}),
    )
    assert out.returncode == 2, out.stderr[-3000:]
    err = out.stderr
    assert err.count("Traceback (most recent call last):") == 2, err[-3000:]  # the user's error, then rlhfkit's
    assert f'my_module.py", line {RAISING_LINE}, in parse' in err and "json.decoder.JSONDecodeError" in err
    assert "The above exception was the direct cause of the following exception" in err
    last = err.strip().splitlines()[-1]  # the one line still ends it
    assert last.startswith("rlhfkit rl: error: reward function 'score' raised JSONDecodeError")
    assert last.endswith(f"(my_module.py:{RAISING_LINE} in parse)")


def test_every_command_takes_the_switch():
    parser = _parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    assert [name for name, sub in commands.items() if "--traceback" not in sub._option_string_actions] == []


def test_the_switch_prints_the_traceback_of_any_one_line_error(monkeypatch, capsys):
    monkeypatch.delenv("RLHFKIT_TRACEBACK", raising=False)
    assert main(["demo", "--steps", "0"]) == 2
    assert capsys.readouterr().err == "rlhfkit demo: error: --steps must be an integer in [1, 1000000], got 0\n"
    assert main(["demo", "--steps", "0", "--traceback"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and "in _check_count" in err, err
    assert err.endswith(
        "ValueError: --steps must be an integer in [1, 1000000], got 0\n"
        "rlhfkit demo: error: --steps must be an integer in [1, 1000000], got 0\n"
    ), err


def test_a_bad_traceback_setting_is_one_line_naming_it(monkeypatch, capsys):
    monkeypatch.setenv("RLHFKIT_TRACEBACK", "maybe")
    assert main(["demo", "--steps", "1"]) == 2
    assert capsys.readouterr().err == (
        "rlhfkit demo: error: RLHFKIT_TRACEBACK must be 1 or 0 (also true/false, yes/no, on/off), got 'maybe'\n"
    )


@pytest.mark.slow  # two processes under torchrun (~20 s on 2 cores)
def test_under_torchrun_the_failing_rank_says_it_once_with_its_traceback_and_every_process_exits(recipe, tmp_path):
    (tmp_path / "my_module.py").write_text(
        "import os\n\n\ndef score(prompts, completions, **kwargs):\n"
        "    if os.environ.get('RANK') == '1':\n"
        "        raise RuntimeError('boom on rank 1')\n"
        "    return [0.5] * len(completions)\n"
    )
    out = _rlhfkit(
        "rl",
        "--config",
        str(recipe),
        "max_steps=2",
        "prompts_per_step=4",
        "--quiet",
        "--traceback",
        "--nproc-per-node",
        "2",
        RLHFKIT_DIST_TIMEOUT="60",
    )
    assert out.returncode != 0
    err = out.stderr
    assert err.count('my_module.py", line 6, in score') == 1, err[-3000:]  # one traceback, rank 1's
    lines = [line for line in err.splitlines() if line.startswith("rlhfkit rl: error:")]
    assert len(lines) == 1 and lines[0].startswith(
        "rlhfkit rl: error: [rank 1] reward function 'score' raised RuntimeError: boom on rank 1"
    ), err[-3000:]
    assert lines[0].endswith("(my_module.py:6 in score)")
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(recipe) not in ps  # no rank left running
