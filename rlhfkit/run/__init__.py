"""The run lifecycle every trainer holds: the run directory and its record (``directory``), the
optimizer step with the non-finite guard and the schedule (``training``), checkpoints — save,
resume, prune — in a pickle-free format (``checkpoint``, ``checkpoint_format``), and the metrics
log with the experiment trackers (``metrics``, ``trackers``). Below the trainers: it imports the
config, models and distributed layers, never a trainer."""
