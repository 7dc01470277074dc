"""The run lifecycle every trainer holds: the run directory (``directory``) and its record
(``record``: ``config.yaml``, written as the matching command's job), the optimizer step with the
non-finite guard and the schedule (``training``), checkpoints — save, resume, prune — in a
pickle-free format (``checkpoint``, ``checkpoint_format``), and the metrics log with the
experiment trackers (``metrics``, ``trackers``). Below the trainers: it imports the config,
models, data and distributed layers and ``report`` (the plots), never a trainer or the command
line's ``jobs`` (tests/test_layering.py)."""
