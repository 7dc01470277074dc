"""Same seed, same run (issue 42, item 4): two runs of one RL script with the same seed on one machine
give bitwise-equal weights and metrics (every metric but the timings).

Each run is its own Python process with its own ``PYTHONHASHSEED`` (so nothing may hang on set or
dict order of strings, or on anything else a fresh process draws anew) and torch's default thread
count: what a user gets by running a script twice. The GRPO preset covers the per-prompt sampling
seeds (``rl.sampler.Sampler.sampling_seeds``), group advantages, the minibatch order and a reward
function; the model is the toy task's tiny Llama at width 256, so its matmuls are large enough to be
split over threads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

RUN = r"""
import hashlib, json, sys
import transformers
from rlhfkit.tasks.toy import toy_trainer

transformers.utils.logging.disable_progress_bar()
trainer = toy_trainer("grpo", model_kwargs={"hidden_size": 256}, max_steps=6, progress_bar=False)
history = trainer.train()
h = hashlib.sha256()
for name, tensor in sorted(trainer.models.policy.state_dict().items()):
    h.update(name.encode())
    h.update(tensor.detach().float().contiguous().numpy().tobytes())
timing = ("perf/time_", "perf/tokens_per_s")
metrics = [{k: v for k, v in row.items() if not k.startswith(timing)} for row in history]
print(json.dumps({"weights": h.hexdigest(), "metrics": metrics}))
"""


def one_run(hash_seed: str) -> dict:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    env.pop("OMP_NUM_THREADS", None)
    out = subprocess.run([sys.executable, "-c", RUN], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_two_runs_with_the_same_seed_give_the_same_weights_and_metrics():
    first, second = one_run("1"), one_run("2")
    assert len(first["metrics"]) == 6
    # metric by metric first: a difference names the step and the metric where the runs part
    for step, (a, b) in enumerate(zip(first["metrics"], second["metrics"]), start=1):
        assert a == b, (step, {k: (a[k], b.get(k)) for k in a if a[k] != b.get(k)})
    assert first["weights"] == second["weights"]
