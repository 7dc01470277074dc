"""What the TRL comparisons share: the weights of a saved model and the difference of two updates."""

from __future__ import annotations

import torch

TOLERANCE = 1e-3  # relative difference of the update: float32 sums in another order stay below ~1e-4


def weights(model) -> dict[str, torch.Tensor]:
    """A detached float32 copy of ``model``'s state dict."""
    return {k: v.detach().float().clone() for k, v in model.state_dict().items()}


def start_weights(model_dir: str) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return weights(AutoModelForCausalLM.from_pretrained(model_dir))


def update_difference(start: dict, theirs: dict, ours: dict) -> float:
    """The largest, over the tensors that moved, of ``|ours - theirs| / |theirs - start|`` (2-norms):
    how far rlhfkit's update is from TRL's, relative to TRL's update. Every tensor must be present in both."""
    assert theirs.keys() == ours.keys(), set(theirs) ^ set(ours)
    moved = [k for k in theirs if (theirs[k] - start[k]).norm() > 0]
    assert moved, "TRL's step moved no weight: the comparison would be empty"
    return max(((theirs[k] - ours[k]).norm() / (theirs[k] - start[k]).norm()).item() for k in moved)


# ---------------------------------------------------------------- GRPO and RLOO: one step, sampling taken out
# Both trainers' generation is replaced by the same fixed completions of each prompt (TRL's
# ``_generate_single_turn``, rlhfkit's engine), so what is compared is everything after it: the batch
# arithmetic, rewards, advantages, the loss and its normalisation, clipping, AdamW and the schedule.
# TRL shuffles a generation's rows before splitting it into micro-batches; that shuffle is taken out
# (``shuffle_sequence_dict``) and every case sets per_device_train_batch_size = num_generations, so
# each micro-batch holds one prompt's group on both sides (rlhfkit orders a minibatch's rows by
# prompt: ``rl.update.group_by_prompt``) — the micro-batches then hold the same rows, whatever the
# order of the prompts.

PROMPTS = ["abc", "hello", "xyz 12", "qq", "the cat", "go", "12+3=", "hi there", "ok", "fine day"]
# max_grad_norm=0: no clipping, which would rescale a gradient to norm 1 and hide a wrong normaliser
COMMON = dict(
    learning_rate=1e-3,
    use_cpu=True,
    bf16=False,
    report_to="none",
    seed=0,
    logging_steps=1,
    save_strategy="no",
    max_completion_length=6,
    max_grad_norm=0.0,
)


TRUNCATED = {
    2,
    5,
    6,
}  # the calls (mod 2G, G = 4) whose completion is truncated: 1 of 4 in a first generation, 2 in a second


def completion(tokenizer, prompt: str, j: int, limit: int) -> list[int]:
    """The ``j``-th fixed completion of ``prompt``: 'a's and a 'b' in a length that varies with ``j``
    and the prompt, ended by EOS — or, for the ``j`` of ``TRUNCATED`` (mod 8), ``limit`` tokens without
    EOS, as a sampler leaves a truncated one. Successive generations of a prompt differ, so that two
    optimizer steps see different shares of truncated (and unscored) rows: with AdamW, a gradient
    scaled alike on every step gives the same update, and would hide a wrong normaliser."""
    text = ("a" * (1 + (len(prompt) + j) % 4)) + ("b" if j % 2 else "")
    if j % 8 in TRUNCATED:
        return tokenizer((text * limit)[:limit], add_special_tokens=False)["input_ids"]
    return tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def sampling_logprobs(model, prompt_ids: list[int], completion: list[int], offsets=(-1.5, 0.0, 0.6, -0.3, 1.2)):
    """A rollout engine's log-probs of ``completion``: the model's own, shifted by ``offsets`` in turn,
    so that the importance ratios of the sampling correction spread on both sides of 1."""
    ids = torch.tensor([prompt_ids + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float()
    own = torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]
    return [float(x) + offsets[i % len(offsets)] for i, x in enumerate(own)]


def dataset(kwargs: dict, n: int | None = None) -> list[dict]:
    """As many prompts as one generation takes (or ``n``): each further generation is another epoch of
    the same prompts, whatever order either trainer draws them in."""
    per_generation = kwargs["per_device_train_batch_size"] * kwargs.get(
        "steps_per_generation", kwargs.get("gradient_accumulation_steps", 1)
    )
    return [{"prompt": p} for p in PROMPTS[: n or per_generation // kwargs["num_generations"]]]


class FixedCompletions:
    """The j-th call for a prompt gets its ``completion(..., j)`` (and, with ``logprob_model``, the
    log-probs an engine would report for it)."""

    def __init__(self, tokenizer, limit: int, logprob_model=None):
        self.tokenizer, self.limit, self.logprob_model, self.seen = tokenizer, limit, logprob_model, {}

    def __call__(self, prompt_ids: list[int]) -> tuple[list[int], list[float] | None]:
        prompt = self.tokenizer.decode(prompt_ids)
        j = self.seen.get(prompt, 0)
        self.seen[prompt] = j + 1
        ids = completion(self.tokenizer, prompt, j, self.limit)
        return ids, None if self.logprob_model is None else sampling_logprobs(self.logprob_model, prompt_ids, ids)


def trl_run(
    model_dir: str,
    kwargs: dict,
    out: str,
    reward_funcs,
    data: list[dict],
    *,
    trainer_class="GRPO",
    use_vllm: bool = False,
):
    """TRL's trainer on the fixed completions; returns ``(final weights, trainer)``. ``use_vllm``: the
    trainer takes the engine-log-prob path of vLLM (its importance-sampling correction) with the
    log-probs of ``sampling_logprobs``."""
    import trl.trainer.grpo_trainer as grpo_module
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config_class, cls = (
        getattr(__import__("trl"), f"{trainer_class}Config"),
        getattr(__import__("trl"), f"{trainer_class}Trainer"),
    )
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    fixed = FixedCompletions(
        tok,
        kwargs.get("max_completion_length", COMMON["max_completion_length"]),
        AutoModelForCausalLM.from_pretrained(model_dir) if use_vllm else None,
    )
    trainer = cls(
        model=model,
        reward_funcs=reward_funcs,
        args=config_class(output_dir=out, **{**COMMON, **kwargs}),
        train_dataset=Dataset.from_list(data),
        processing_class=tok,
    )

    def generate(prompt_ids, *args, **kwargs):  # (prompt_ids, images, multimodal_fields[, num_generations, ...])
        rows = [fixed(list(p)) for p in prompt_ids]
        if trainer_class == "RLOO":  # RLOO's returns the completions alone
            return [c for c, _ in rows]
        return [c for c, _ in rows], ([lp for _, lp in rows] if use_vllm else None)

    trainer._generate_single_turn = generate
    if use_vllm:
        trainer.use_vllm = True
    original = getattr(grpo_module, "shuffle_sequence_dict", None)
    for module in {grpo_module, __import__(f"trl.trainer.{trainer_class.lower()}_trainer", fromlist=["x"])}:
        if hasattr(module, "shuffle_sequence_dict"):
            module.shuffle_sequence_dict = lambda batch: batch
    try:
        trainer.train()
    finally:
        if original is not None:
            grpo_module.shuffle_sequence_dict = original
    return weights(trainer.model), trainer


def ours_run(
    model_dir: str,
    kwargs: dict,
    out: str,
    reward_funcs,
    data: list[dict],
    *,
    trainer_class="GRPO",
    use_vllm: bool = False,
):
    """rlhfkit's drop-in trainer on the same fixed completions; returns ``(final weights, trainer)``.
    ``use_vllm``: the config is translated as with ``use_vllm=True`` (the sampling correction on), the
    engine stays the HF one but reports the log-probs of ``sampling_logprobs``."""
    from transformers import AutoModelForCausalLM

    import rlhfkit.trl as dropin
    from rlhfkit.rollout.base import build_rollout

    config_class, cls = getattr(dropin, f"{trainer_class}Config"), getattr(dropin, f"{trainer_class}Trainer")
    config = config_class(output_dir=out, **{**COMMON, **kwargs})
    trainer = cls(model=model_dir, reward_funcs=reward_funcs, args=config, train_dataset=data)
    if use_vllm:  # the translation of use_vllm=True, on the HF engine
        vllm = config_class(output_dir=out, **{**COMMON, **kwargs, "use_vllm": True}).to_rlhfkit(len(data))
        trainer.config = vllm.replace(rollout_engine="hf")
    tok = trainer.tokenizer
    fixed = FixedCompletions(
        tok,
        kwargs.get("max_completion_length", COMMON["max_completion_length"]),
        AutoModelForCausalLM.from_pretrained(model_dir) if use_vllm else None,
    )

    def generate(prompts, n, sampling, seed=None):
        rows = [fixed(list(p)) for p in prompts for _ in range(n)]
        rollout = build_rollout(prompts, [c for c, _ in rows], n, tok.pad_token_id, tok.eos_token_id)
        if use_vllm:
            lp = torch.zeros(rollout.response_mask.shape)
            for i, (_, row) in enumerate(rows):
                lp[i, : len(row)] = torch.tensor(row)
            rollout.logprobs = lp
        return rollout

    trainer.sampler.engine.generate = generate
    trainer.train()
    return weights(trainer.models.policy), trainer


def fraction_of_a(completions, **kwargs):
    return [c.count("a") / max(1, len(c)) for c in completions]
