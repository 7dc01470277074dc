"""The step timeline (``rlhfkit/run/trace.py``): a run directory gets one ``trace.json`` in the Chrome
trace-event format, each step an event holding its phases; a run that fails keeps the steps it
finished, and ``rlhfkit report`` merges them and links the file. The timeline of an asynchronous run
(trainer and generator ranks in one file) is checked by tests/distributed/test_async.py."""

import json

import pytest

from rlhfkit.cli import main as cli
from rlhfkit.config import RLConfig
from rlhfkit.run import trace
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.tasks.toy import PROMPTS, fraction_of_a
from rlhfkit.trainers import RLTrainer, SFTConfig, SFTTrainer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

RL_PHASES = {"generate", "reward", "logprobs", "update", "optimizer_step", "evaluate", "checkpoint"}


def rl_run(out, reward=fraction_of_a, **overrides):
    tok = char_tokenizer()
    args = dict(
        algorithm="grpo",
        prompts_per_step=2,
        max_new_tokens=4,
        max_steps=2,
        log_every=0,
        seed=0,
        output_dir=str(out),
        save_steps=1,
        eval_every=1,
    )
    args.update(overrides)
    return RLTrainer(
        tiny_causal_lm(tok, hidden_size=32, seed=0),
        [reward],
        RLConfig(**args),
        train_dataset=PROMPTS,
        eval_dataset=PROMPTS[:2],
        processing_class=tok,
    )


def events(path) -> list[dict]:
    data = json.loads(path.read_text())
    assert set(data) >= {"traceEvents"}
    return data["traceEvents"]


def steps_and_phases(evs: list[dict], pid: int = 0) -> dict[int, set[str]]:
    """Each step's number -> the names of the events inside it (start and end within the step's)."""
    timed = [e for e in evs if e["ph"] == "X" and e["pid"] == pid]
    for e in timed:
        assert isinstance(e["ts"], (int, float)) and e["dur"] >= 0 and e["tid"] == 0, e
    steps = [e for e in timed if e["name"] == "step"]
    inside = {}
    for s in steps:
        end = s["ts"] + s["dur"] + 0.2  # ts and dur are rounded to 0.1 µs each
        inside[s["args"]["step"]] = {
            e["name"] for e in timed if e is not s and e["ts"] >= s["ts"] - 0.1 and e["ts"] + e["dur"] <= end
        }
    return inside


def test_an_rl_run_writes_a_chrome_trace_with_each_steps_phases_inside_it(tmp_path):
    rl_run(tmp_path).train()
    evs = events(tmp_path / "trace.json")
    assert {e["ph"] for e in evs} == {"M", "X"}
    assert [e["args"]["name"] for e in evs if e["name"] == "process_name"] == ["trainer rank 0"]
    inside = steps_and_phases(evs)
    assert sorted(inside) == [1, 2]
    for step, names in inside.items():
        assert names == RL_PHASES, step
    # the evaluation before the first step, outside every step, and the final save
    assert [e["args"]["step"] for e in evs if e["name"] == "evaluate"] == [0, 1, 2]
    assert [e["name"] for e in evs if e["ph"] == "X"][-1] == "save_final"
    assert not (tmp_path / "trace").exists()  # the ranks' files merged, then removed
    assert (tmp_path / "plots" / "time.png").is_file()  # the per-phase time plot


def test_a_supervised_run_writes_its_steps_too(tmp_path):
    tok = char_tokenizer()
    rows = [{"prompt": f"{w}=", "completion": w[::-1]} for w in ["abc", "hello", "xyz", "cat"]]
    SFTTrainer(
        tiny_causal_lm(tok, hidden_size=32, seed=0),
        SFTConfig(batch_size=2, max_steps=2, log_every=0, output_dir=str(tmp_path)),
        rows,
        processing_class=tok,
    ).train()
    inside = steps_and_phases(events(tmp_path / "trace.json"))
    assert inside == {1: {"optimizer_step"}, 2: {"optimizer_step"}}


def test_a_failed_run_keeps_its_finished_steps_and_the_report_merges_and_links_them(tmp_path):
    calls = []

    def fails_in_step_3(prompts, completions, **columns):
        calls.append(len(completions))
        if calls.count(8) > 2:  # 2 prompts x 4 completions: steps 1 and 2 score once each (evaluation: 2)
            raise RuntimeError("the reward server went away")
        return [0.5 * (i % 2) for i in range(len(completions))]

    with pytest.raises(ValueError, match="went away"):
        rl_run(tmp_path, reward=fails_in_step_3, max_steps=4, save_steps=0, eval_every=0).train()
    trace.stop()  # what exiting the process does (atexit)
    rank_file = tmp_path / "trace" / "rank-0.jsonl"
    with rank_file.open("a") as f:
        f.write('{"name": "cut sh')  # a line the crash cut short
    assert cli(["report", str(tmp_path)]) == 0
    inside = steps_and_phases(events(tmp_path / "trace.json"))
    assert sorted(inside) == [1, 2] and all(names >= {"generate", "update"} for names in inside.values())
    assert 'href="trace.json"' in (tmp_path / "report.html").read_text()
    before = (tmp_path / "trace.json").read_text()
    assert trace.main([str(tmp_path)]) == 0  # merged again: each event still once
    assert (tmp_path / "trace.json").read_text() == before
