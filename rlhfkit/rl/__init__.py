"""The phases of the one RL loop (``trainers.rl.RLTrainer``) as plain functions of the models, the
config and tensors — what the trainer's loop calls and what the tests call:

    generate (the engine: ``rollout.engines``) → ``score.score`` → ``experience.make_experience``
    → ``update.update`` (its loss: ``update.loss``)

``sampling.sample_batch`` runs generate and score in rounds under DAPO's dynamic sampling (one
round otherwise); ``advantages`` holds the score shaping, token rewards, advantages and rollout
correction those phases share; ``evaluate`` the greedy evaluation of a policy on held-out prompts.
The formulas themselves are pure tensor math in ``rlhfkit.algorithms``. Above the models, data,
rewards and rollout engines; below the trainers, and independent of the run lifecycle
(``rlhfkit.run``): the trainer passes in what it needs from there (its optimizer step, its phases
1–3 as one round).

The submodules are imported by name (``from rlhfkit.rl.update import update``); this package
re-exports nothing, so ``rlhfkit.rl.update`` always names the module.
"""
