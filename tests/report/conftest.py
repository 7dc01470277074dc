"""Tiny synthetic run directories for the report's tests: ``make_run(path, ...)``."""

from __future__ import annotations

import json

import pytest


@pytest.fixture()
def make_run():
    def make(
        path,
        steps=6,
        metrics=("reward/mean", "perf/lr", "perf/grad_norm"),
        offset=0.0,
        started=None,
        samples=None,
        config=None,
    ):
        """A run directory: ``metrics.jsonl`` with each of ``metrics`` over ``steps`` steps (values
        shifted by ``offset``); ``started``: a run.json whose one session started then (unix time)
        and lasted 90 s; ``samples``: rows for samples.jsonl; ``config``: config.yaml's text."""
        path.mkdir(parents=True)
        rows = [{"step": s, **{m: offset + s / steps + 0.1 * (s % 2) for m in metrics}} for s in range(1, steps + 1)]
        (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        if started is not None:
            session = {
                "started": f"2026-01-0{1 + int(started) % 9}T10:00:00+0000",
                "started_unix": started,
                "ended": "2026-01-01T10:01:30+0000",
                "duration_s": 90.0,
                "git_commit": "abcdef1234567890",
                "git_dirty": False,
                "rlhfkit": "0.1.0",
                "torch": "2.13.0",
                "transformers": "5.24.0",
                "python": "3.11.7",
                "host": "box-<1>",
                "device": "cpu",
                "processes": 1,
                "argv": ["rlhfkit", "rl"],
                "resume_from": None,
            }
            (path / "run.json").write_text(json.dumps({"sessions": [session]}))
        if samples is not None:
            (path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in samples))
        if config is not None:
            (path / "config.yaml").write_text(config)
        return path

    return make
