"""tools/mypy_baseline.py: mypy's errors against the checked-in baseline, compared by file, code and
message (not line), with counts; new errors fail, vanished ones fail too until the baseline is shrunk, --update
only shrinks, and a file with no entry (a new module) never gains one."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("mypy_baseline", ROOT / "tools" / "mypy_baseline.py")
mypy_baseline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mypy_baseline)

OUTPUT = """\
rlhfkit/a.py:10: error: Need type annotation for "rows"  [var-annotated]
rlhfkit/a.py:20: error: Need type annotation for "rows"  [var-annotated]
rlhfkit/b.py:3: note: a note is not an error
rlhfkit/b.py:7: error: Name "f" already defined on line 4  [no-redef]
Found 3 errors in 2 files (checked 2 source files)
"""


def _run(tmp_path, output: str, baseline: str | None, *flags: str) -> int:
    (tmp_path / "out.txt").write_text(output)
    if baseline is not None:
        (tmp_path / "baseline.txt").write_text(baseline)
    args = ["--mypy-output", str(tmp_path / "out.txt"), "--baseline", str(tmp_path / "baseline.txt"), *flags]
    return mypy_baseline.main(args)


def test_keys_leave_out_line_numbers_and_keep_counts():
    keys = [key for key, _ in mypy_baseline.parse(OUTPUT)]
    assert keys == [
        'rlhfkit/a.py [var-annotated] Need type annotation for "rows"',
        'rlhfkit/a.py [var-annotated] Need type annotation for "rows"',
        'rlhfkit/b.py [no-redef] Name "f" already defined on line N',
    ]


BASELINE = "".join(f"{key}\n" for key, _ in mypy_baseline.parse(OUTPUT))


def test_a_new_error_fails_and_a_moved_one_does_not(tmp_path, capsys):
    assert _run(tmp_path, OUTPUT, BASELINE) == 0
    moved = OUTPUT.replace("a.py:10:", "a.py:99:").replace("line 4", "line 40")
    assert _run(tmp_path, moved, None) == 0
    third = OUTPUT + 'rlhfkit/a.py:30: error: Need type annotation for "rows"  [var-annotated]\n'
    assert _run(tmp_path, third, None) == 1  # one more of an entry than the baseline counts
    assert 'rlhfkit/a.py:30: error: Need type annotation for "rows"' in capsys.readouterr().out


def test_a_vanished_error_fails_until_update_shrinks_the_baseline_which_never_grows(tmp_path, capsys):
    fewer = "\n".join(line for line in OUTPUT.splitlines() if "b.py:7" not in line)
    assert _run(tmp_path, fewer, BASELINE) == 1  # the fix must shrink the baseline in the same commit
    assert 'gone: rlhfkit/b.py [no-redef] Name "f" already defined on line N' in capsys.readouterr().out
    assert _run(tmp_path, fewer, None, "--update") == 0
    assert _run(tmp_path, fewer, None) == 0
    assert "b.py" not in (tmp_path / "baseline.txt").read_text()
    assert _run(tmp_path, OUTPUT, None, "--update") == 1  # growing it needs --allow-grow
    assert "b.py" not in (tmp_path / "baseline.txt").read_text()


def test_a_file_with_no_entry_never_gains_one_even_with_allow_grow(tmp_path, capsys):
    only_a = "".join(line + "\n" for line in BASELINE.splitlines() if line.startswith("rlhfkit/a.py"))
    assert _run(tmp_path, OUTPUT, only_a, "--update", "--allow-grow") == 1
    assert (
        "a new module starts clean" in capsys.readouterr().out and "b.py" not in (tmp_path / "baseline.txt").read_text()
    )
    extra = OUTPUT + 'rlhfkit/a.py:40: error: Name "g" is not defined  [name-defined]\n'
    assert _run(tmp_path, extra, BASELINE, "--update", "--allow-grow") == 0  # a listed file may (a mypy upgrade)


def test_a_failed_mypy_run_is_not_a_pass(tmp_path):
    assert _run(tmp_path, "pyproject.toml: [mypy]: invalid section\n", "") == 2
