"""TRL 1.16's GRPO objective and rlhfkit's ``grpo`` preset on one batch: the same loss and gradient?

    pip install trl==1.16.0            # in an environment of its own (it is not an rlhfkit dependency)
    PYTHONPATH=. python benchmarks/trl_objective.py

One batch of the toy task (4 prompts x 8 completions, sampled by rlhfkit, scored, advantages by the
``grpo`` preset: group mean and unbiased std), then the policy loss and its gradient twice from the same
weights: rlhfkit's (``rlhfkit.rl.update.loss``) and TRL's ``GRPOTrainer._compute_loss`` with
``loss_type="grpo"``, ``beta=0``, ``epsilon=0.2``, fed the same ids, masks and advantages. Twice: on
policy (old log-probs = the current ones, ratio 1) and off policy (old log-probs shifted by Gaussian
noise of ``--noise`` nats per token, so the clip binds on some tokens). Prints one JSON line per case:
both losses, the largest relative gradient difference over the parameter tensors (in norm), and the
share of tokens whose ratio left [0.8, 1.2]. The advantages are not compared here: TRL's formula
(``grpo_trainer.py``: ``(r - mean) / (std + 1e-4)``, unbiased std per group) is rlhfkit's with eps 1e-4
instead of 1e-6.
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile

import torch


def _ours(seed: int):
    from rlhfkit.tasks.toy import toy_trainer

    trainer = toy_trainer("grpo", group_size=8, prompts_per_step=4, kl_coef=0.0, seed=seed)
    rows = trainer.sampler.sample_prompts()
    rollout = trainer.sampler.engine.generate(
        [trainer.sampler.prompt_ids[i] for i in rows], 8, trainer.sampler.sampling
    )
    scores, valid, metrics = trainer.sampler.score(rows, rollout)
    return trainer, trainer.make_experience(rollout, scores, valid, metrics)


def _trl(model, tokenizer, out_dir: str):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=out_dir,
        beta=0.0,
        num_generations=8,
        per_device_train_batch_size=32,
        max_completion_length=8,
        loss_type="grpo",
        epsilon=0.2,
        temperature=1.0,
        report_to=[],
        use_cpu=True,
        bf16=False,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_list([{"prompt": "a"}] * 32),
        processing_class=tokenizer,
    )
    trainer.current_gradient_accumulation_steps = 1  # set by the training loop; one window here
    return trainer


def _grads(model) -> dict[str, torch.Tensor]:
    out = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--noise", type=float, default=0.3)
    a = p.parse_args()

    from rlhfkit.config import part
    from rlhfkit.rl.update import UpdateLoss
    from rlhfkit.rl.update import loss as rlhfkit_loss

    ours, exp = _ours(a.seed)
    policy = ours.models.policy
    trl = _trl(copy.deepcopy(policy), ours.tokenizer, tempfile.mkdtemp())
    r, mask = exp.rollout, exp.mask
    n_prompt = r.prompt_len
    rows = torch.arange(mask.shape[0])
    row_adv = (exp.advantages * mask).sum(1) / mask.sum(1).clamp(min=1)
    with torch.no_grad():
        current = ours.models.train_outputs(r, with_values=False, entropy_grad=False)[0]
    torch.manual_seed(a.seed)
    for case, old in (("on-policy", None), ("off-policy", current + a.noise * torch.randn_like(current) * mask)):
        exp.old_logprobs = old
        mine, _ = rlhfkit_loss(ours.models, part(UpdateLoss, ours.args), exp, rows, 0.0)
        mine.backward()
        g_ours = _grads(policy)
        inputs = {
            "prompt_ids": r.input_ids[:, :n_prompt],
            "prompt_mask": r.attention_mask[:, :n_prompt],
            "completion_ids": r.input_ids[:, n_prompt:],
            "completion_mask": mask.long(),
            "advantages": row_adv,
            "old_per_token_logps": old,
            "num_items_in_batch": mask.sum(),
        }
        trl.model.train()
        theirs = trl._compute_loss(trl.model, inputs)
        theirs.backward()
        g_trl = _grads(trl.model)
        rel = max(float((g_ours[n] - g_trl[n]).norm() / g_trl[n].norm().clamp(min=1e-30)) for n in g_trl)
        clipped = 0.0 if old is None else float((((current - old).exp() - 1).abs() > 0.2)[mask].float().mean())
        print(
            json.dumps(
                {
                    "case": case,
                    "loss_rlhfkit": mine.item(),
                    "loss_trl": theirs.item(),
                    "max_rel_grad_diff": rel,
                    "tensors": len(g_trl),
                    "clipped_token_share": clipped,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
