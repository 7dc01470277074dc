"""DistillationTrainer: rlhfkit's drop-in against TRL 1.16's own, two optimizer steps from the same student, teacher,
prompts, completions and config — the same logged loss at each step and the same weights after them, to float
tolerance.

Sampling is taken out as in ``test_grpo_parity.py``: both trainers' generation is replaced by the same fixed
completions of each prompt (``Fixed``: lengths that differ between prompts and between the two steps, one truncated
in each), so what is compared is everything after it: the batch arithmetic (a generation batch of
``per_device_train_batch_size x gradient_accumulation_steps`` prompts, one optimizer step), the generalized JSD of
both full distributions at the temperature, its normalisation by the step's completion tokens, AdamW and the
schedule. TRL's shuffle of a generation batch is taken out too. The prompts are all 3 characters long: TRL's loss
forward passes no position ids, so a left-padded prompt would be read at shifted positions there (rlhfkit counts
positions from the first real token); equal lengths leave no padding to disagree about.
"""

import pytest
import torch
from harness import COMMON, TOLERANCE, start_weights, update_difference, weights

PROMPTS = ["abc", "xyz", "the", "cat"]  # one generation batch: 2 per micro-step x 2 accumulated
# The completion's length for each prompt at the first and the second step (None: max_completion_length tokens
# without EOS, truncated): the micro-batches hold different numbers of tokens, so a normaliser per micro-batch
# instead of per step would show
LENGTHS = [[1, 4, None, 2], [3, None, 5, 1]]
TWO_STEPS = dict(
    per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=2, temperature=0.7, max_completion_length=6
)


@pytest.fixture(scope="session")
def teacher_dir(tmp_path_factory):
    """Another tiny Llama with the student's tokenizer (other random weights): the teacher."""
    from rlhfkit.tasks.tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("teacher") / "model", seed=1)


class Fixed:
    """The j-th completion of a prompt: ``LENGTHS[j]`` letters then EOS, or a truncated one."""

    def __init__(self, tokenizer, limit: int):
        self.tokenizer, self.limit, self.seen = tokenizer, limit, {}

    def __call__(self, prompt_ids) -> list[int]:
        prompt = self.tokenizer.decode(list(prompt_ids))
        i, j = PROMPTS.index(prompt), self.seen.get(prompt, 0)
        self.seen[prompt] = j + 1
        n = LENGTHS[j][i]
        text = "".join("ab"[(i + k) % 2] for k in range(n or self.limit))
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids if n is None else ids + [self.tokenizer.eos_token_id]


def trl_run(model_dir, teacher_dir, kwargs, out):
    import trl.trainer.distillation_trainer as module
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    trainer = module.DistillationTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        teacher_model=teacher_dir,
        args=module.DistillationConfig(output_dir=out, **{**COMMON, **kwargs}),
        train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS]),
        processing_class=tok,
    )
    fixed = Fixed(tok, kwargs["max_completion_length"])
    trainer._generate_single_turn = lambda prompt_ids, *args, **kw: [fixed(p) for p in prompt_ids]
    original, module.shuffle_sequence_dict = module.shuffle_sequence_dict, lambda batch: batch
    try:
        trainer.train()
    finally:
        module.shuffle_sequence_dict = original
    return weights(trainer.model), trainer


def ours_run(model_dir, teacher_dir, kwargs, out):
    from rlhfkit.rollout.base import build_rollout
    from rlhfkit.trl import DistillationConfig, DistillationTrainer

    trainer = DistillationTrainer(
        model=model_dir,
        teacher_model=teacher_dir,
        args=DistillationConfig(output_dir=out, **{**COMMON, **kwargs}),
        train_dataset=[{"prompt": p} for p in PROMPTS],
    )
    tok = trainer.tokenizer
    fixed = Fixed(tok, kwargs["max_completion_length"])

    def generate(prompts, n, sampling, seed=None):
        completions = [fixed(p) for p in prompts for _ in range(n)]
        return build_rollout(prompts, completions, n, tok.pad_token_id, tok.eos_token_id)

    trainer.sampler.engine.generate = generate
    trainer.train()
    return weights(trainer.models.policy), trainer


def losses(trainer) -> list[tuple[int, float, float]]:
    """``(step, loss, entropy)`` of each training row of ``state.log_history``."""
    return [(r["step"], r["loss"], r["entropy"]) for r in trainer.state.log_history if "loss" in r]


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_two_distillation_steps_are_trls(model_dir, teacher_dir, tmp_path, beta):
    """beta 0 (forward KL), 0.5 (JSD), 1 (reverse KL), temperature 0.7, 2 accumulated micro-steps of 2 prompts."""
    kwargs = dict(TWO_STEPS, beta=beta)
    start = start_weights(model_dir)
    theirs, trl_trainer = trl_run(model_dir, teacher_dir, kwargs, str(tmp_path / "trl"))
    ours, our_trainer = ours_run(model_dir, teacher_dir, kwargs, str(tmp_path / "ours"))
    assert our_trainer.state.global_step == trl_trainer.state.global_step == 2
    trl_rows, our_rows = losses(trl_trainer), losses(our_trainer)
    assert [s for s, _, _ in trl_rows] == [s for s, _, _ in our_rows] == [1, 2]
    diff = update_difference(start, theirs, ours)
    largest = max((theirs[k] - ours[k]).abs().max().item() for k in theirs)
    print(f"DIFF beta={beta}: loss TRL {[r[1] for r in trl_rows]} ours {[r[1] for r in our_rows]}; ", end="")
    print(f"entropy TRL {[r[2] for r in trl_rows]} ours {[r[2] for r in our_rows]}; ", end="")
    print(f"update {diff:.2e}, max |dw| {largest:.2e}")
    for (_, their_loss, their_entropy), (_, our_loss, our_entropy) in zip(trl_rows, our_rows):
        assert our_loss == pytest.approx(their_loss, rel=1e-4, abs=1e-7)
        # TRL averages its micro-batches' entropy means, rlhfkit weighs them by their tokens: close, not equal
        assert our_entropy == pytest.approx(their_entropy, rel=2e-2)
    assert trl_rows[0][1] != pytest.approx(trl_rows[1][1], rel=1e-3)  # the second step's loss is a new one
    assert diff < TOLERANCE
    assert torch.isfinite(torch.tensor(largest))
