"""``callbacks=[...]`` (transformers' ``TrainerCallback`` interface, ``rlhfkit/run/callbacks.py``) on
all four trainers: the events fire in the HF Trainer's order with its ``TrainerState``, and
``control.should_training_stop`` ends the run after that step, evaluated and saved as a last step."""

import pytest
import torch
from transformers import TrainerCallback

from rlhfkit.tasks.toy import PROMPTS
from tests.run.test_lifecycle import KINDS, PAIRS, SFT_ROWS

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

EVAL = {"sft": SFT_ROWS[:2], "rm": PAIRS[:2], "dpo": PAIRS[:2], "rl": PROMPTS[:2]}
EVAL_KEY = {
    "sft": "eval/loss",
    "rm": "eval/accuracy",
    "dpo": "eval/rewards/accuracies",
    "rl": "eval/fraction_of_a_mean",
}


class Recorder(TrainerCallback):
    """Records every event; asks to stop at step ``stop_at`` (never when None)."""

    def __init__(self, stop_at=None):
        self.stop_at, self.events, self.states = stop_at, [], []

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.events.append("train_begin")
        self.begin = (state.max_steps, state.global_step, isinstance(model, torch.nn.Module), optimizer is not None)

    def on_step_begin(self, args, state, control, **kwargs):
        self.events.append("step_begin")

    def on_step_end(self, args, state, control, **kwargs):
        self.events.append(f"step_end {state.global_step}")
        if state.global_step == self.stop_at:
            control.should_training_stop = True

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.events.append("evaluate")
        self.metrics = metrics

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.events.append(f"log {logs['step']}")

    def on_train_end(self, args, state, control, **kwargs):
        self.events.append("train_end")


def _trainer(kind, tmp_path, callbacks, **overrides):
    from rlhfkit.config import RLConfig
    from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
    from rlhfkit.trainers import DPOConfig, DPOTrainer, RLTrainer, SFTConfig, SFTTrainer

    if kind == "rm":
        from rlhfkit.models import ScalarModel
        from rlhfkit.trainers import RewardModelConfig, RewardModelTrainer

        tok = char_tokenizer()
        model = ScalarModel.from_causal_lm(tiny_causal_lm(tok, hidden_size=32, seed=0))
        args = RewardModelConfig(
            batch_size=2, learning_rate=1e-3, max_steps=4, log_every=0, output_dir=str(tmp_path), seed=0, **overrides
        )
        return RewardModelTrainer(model, args, PAIRS, EVAL["rm"], processing_class=tok, callbacks=callbacks)
    tok = char_tokenizer()
    model = tiny_causal_lm(tok, hidden_size=32, seed=0)
    common = dict(learning_rate=1e-3, max_steps=4, log_every=0, output_dir=str(tmp_path), seed=0, **overrides)
    if kind == "sft":
        return SFTTrainer(
            model, SFTConfig(batch_size=2, **common), SFT_ROWS, EVAL["sft"], processing_class=tok, callbacks=callbacks
        )
    if kind == "dpo":
        return DPOTrainer(
            model, DPOConfig(batch_size=2, **common), PAIRS, EVAL["dpo"], processing_class=tok, callbacks=callbacks
        )
    from rlhfkit.tasks.toy import fraction_of_a

    return RLTrainer(
        model,
        [fraction_of_a],
        RLConfig(algorithm="grpo", prompts_per_step=2, max_new_tokens=4, **common),
        train_dataset=PROMPTS,
        eval_dataset=EVAL["rl"],
        processing_class=tok,
        callbacks=callbacks,
    )


@pytest.mark.parametrize("kind", KINDS)
def test_a_callback_stops_the_run_after_its_step_evaluated_and_saved(kind, tmp_path):
    recorder = Recorder(stop_at=2)
    history = _trainer(kind, tmp_path, [recorder]).train()
    steps = [r["step"] for r in history if r["step"] > 0]
    assert steps == [1, 2]
    assert EVAL_KEY[kind] in history[-1]  # the stopped step is evaluated as a last step is
    assert (tmp_path / "final").is_dir()
    assert recorder.begin == (4, 0, True, True)
    body = [e for e in recorder.events if e not in ("train_begin", "train_end")]
    evaluate = ["evaluate"]
    assert body[-4:] == ["step_begin", "step_end 2", *evaluate, "log 2"]
    assert recorder.events[0] == "train_begin" and recorder.events[-1] == "train_end"
    assert recorder.events.count("step_begin") == 2
    assert set(recorder.metrics) and all(k.startswith("eval/") for k in recorder.metrics)


@pytest.mark.parametrize("kind", ["sft", "rl"])
def test_callbacks_that_do_not_stop_leave_the_run_whole(kind, tmp_path):
    recorder = Recorder(stop_at=None)
    history = _trainer(kind, tmp_path, Recorder).train()  # a class is instantiated, as the HF Trainer does
    assert [r["step"] for r in history if r["step"] > 0] == [1, 2, 3, 4]
    history = _trainer(kind, tmp_path / "b", [recorder]).train()
    assert [r["step"] for r in history if r["step"] > 0] == [1, 2, 3, 4]
    assert [e for e in recorder.events if e.startswith("step_end")] == [f"step_end {s}" for s in (1, 2, 3, 4)]


def test_a_callback_without_events_is_one_line(tmp_path):
    with pytest.raises(ValueError, match=r"callbacks: object has no on_\* method"):
        _trainer("sft", tmp_path, [object()])


def test_callbacks_with_rollout_workers_are_refused(tmp_path):
    with pytest.raises(ValueError, match="callbacks are not supported with rollout_workers"):
        _trainer("rl", tmp_path, [Recorder()], rollout_workers=1)
