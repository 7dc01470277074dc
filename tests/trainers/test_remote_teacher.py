"""A teacher served elsewhere (``teacher_url``: ``models/remote_teacher.py``): the same teacher weights served by
``rlhfkit serve``'s endpoint and loaded in-process give the same ``teacher_logprobs`` and the same advantages; a
teacher that is down, answers HTTP 500 or takes too long stops the run in one line naming ``teacher_url`` and what
failed, after its retries, and the run's last checkpoint is left as it was; the refusals name their field."""

from __future__ import annotations

import hashlib
import http.server
import json
import socket
import threading
import time
from pathlib import Path

import pytest
import torch

from rlhfkit.config import RLConfig
from rlhfkit.models.remote_teacher import RemoteTeacher
from rlhfkit.serving import build_endpoint
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.tasks.toy import PROMPTS, letter_teacher
from rlhfkit.trainers import RLTrainer

from ..endpoint.conftest import serving

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    tok = char_tokenizer()
    path = tmp_path_factory.mktemp("teacher") / "t"
    letter_teacher(tok).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def trainer(teacher, **overrides):
    tok = char_tokenizer()
    settings = dict(algorithm="distill", max_new_tokens=6, max_steps=1, log_every=0, seed=0, prompts_per_step=4)
    kwargs = {"teacher_model": teacher} if "teacher_url" not in overrides else {}
    config = RLConfig(**{**settings, **overrides, **({} if kwargs else {"teacher_model": teacher})})
    return RLTrainer(tiny_causal_lm(tok, seed=0), None, config, train_dataset=PROMPTS, processing_class=tok, **kwargs)


def sampled(t):
    rows = t.sampler.sample_prompts()
    rollout, _ = t.sampler.generate(rows)
    return rows, rollout


def test_a_served_teacher_gives_the_logprobs_and_advantages_of_the_same_weights_loaded_locally(teacher_dir):
    local = trainer(teacher_dir, distillation_coef=0.7)
    rows, rollout = sampled(local)
    with serving(build_endpoint(teacher_dir, name="teacher", device="cpu")) as endpoint:
        remote = trainer("teacher", teacher_url=endpoint.url, distillation_coef=0.7, teacher_batch_size=3)
        assert isinstance(remote.models.teacher, RemoteTeacher)
        got = remote.models.teacher_logprobs(rollout)
        exp_remote = remote.make_experience(rollout, *remote.sampler.score(rows, rollout))
        assert remote.models.teacher.requests == 2 * 2  # 4 rows in requests of 3 (3 + 1), two passes
    want = local.models.teacher_logprobs(rollout)
    mask = rollout.response_mask.bool()
    assert mask.sum() > 10 and (want[mask] < -0.01).all()
    torch.testing.assert_close(got[mask], want[mask], atol=1e-5, rtol=1e-5)
    assert (got[~mask] == 0).all()
    exp_local = local.make_experience(rollout, *local.sampler.score(rows, rollout))
    torch.testing.assert_close(exp_remote.advantages, exp_local.advantages, atol=1e-5, rtol=1e-5)
    assert exp_remote.advantages[mask].abs().max() > 0.1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stub:
    """A server on a thread answering every POST with ``status`` after ``delay`` s, counting the requests."""

    def __init__(self, status: int = 500, delay: float = 0.0):
        stub = self
        self.count = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                stub.count += 1
                self.rfile.read(int(self.headers["Content-Length"]))
                time.sleep(delay)
                body = json.dumps({"error": {"message": "the teacher\nbroke", "type": "server_error"}}).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # the client gave up
                    pass

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def rollout():
    return sampled(trainer(letter_teacher(char_tokenizer())))[1]


def test_a_teacher_that_is_down_is_one_line_naming_teacher_url_and_the_refused_connection(rollout):
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(ValueError) as err:
        RemoteTeacher(url, retries=1, timeout=2).teacher_logprobs(rollout)
    line = str(err.value)
    assert (
        line
        == f"teacher_url {url}: POST /completions failed after 2 tries: connection refused (is the server running?)"
    )


def test_a_teacher_answering_500_is_retried_then_one_line_with_the_status(rollout):
    stub = Stub(500)
    try:
        with pytest.raises(ValueError) as err:
            RemoteTeacher(stub.url, retries=2, timeout=5).teacher_logprobs(rollout)
    finally:
        stub.close()
    assert stub.count == 3
    assert (
        str(err.value) == f"teacher_url {stub.url}: POST /completions failed after 3 tries: HTTP 500: the teacher broke"
    )


def test_a_teacher_refusing_the_request_is_not_retried(rollout):
    stub = Stub(400)
    try:
        with pytest.raises(ValueError, match=r"failed: HTTP 400: the teacher broke$"):
            RemoteTeacher(stub.url, retries=2, timeout=5).teacher_logprobs(rollout)
    finally:
        stub.close()
    assert stub.count == 1


def test_a_teacher_that_takes_too_long_is_one_line_naming_the_time_limit(rollout):
    stub = Stub(200, delay=1.5)
    try:
        with pytest.raises(ValueError) as err:
            RemoteTeacher(stub.url, retries=0, timeout=0.3).teacher_logprobs(rollout)
    finally:
        stub.close()
    assert (
        str(err.value) == f"teacher_url {stub.url}: POST /completions failed: no answer within teacher_timeout (0.3 s)"
    )


def digest(directory: Path) -> dict:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in directory.rglob("*")
        if p.is_file()
    }


def test_the_run_stops_at_the_failed_step_and_its_last_checkpoint_is_untouched(teacher_dir, tmp_path):
    """One step with the teacher served and a checkpoint; the server gone, the resumed run's next step fails in one
    line; the run directory's checkpoint and the first run's final model stay as they were (no new checkpoint)."""
    out = tmp_path / "run"
    common = dict(distillation_coef=1.0, output_dir=str(out), save_steps=1, teacher_retries=0, teacher_timeout=5)
    with serving(build_endpoint(teacher_dir, name="teacher", device="cpu")) as endpoint:
        url = endpoint.url
        trainer("teacher", teacher_url=url, **common).train()
    before = digest(out / "checkpoint-1"), digest(out / "final")
    resumed = trainer("teacher", teacher_url=url, max_steps=2, resume_from="latest", **common)
    with pytest.raises(ValueError, match=r"^teacher_url http://127\.0\.0\.1:\d+/v1: POST /completions failed: conn"):
        resumed.train()
    assert (digest(out / "checkpoint-1"), digest(out / "final")) == before
    assert not (out / "checkpoint-2").exists()


@pytest.mark.parametrize(
    "overrides,field",
    [
        (dict(distillation_mode="full"), "distillation_mode"),
        (dict(temperature=0.7), "temperature"),
        (dict(teacher_url="host:8000/v1"), "teacher_url"),
        (dict(teacher_batch_size=0), "teacher_batch_size"),
        (dict(teacher_timeout=0), "teacher_timeout"),
    ],
)
def test_refusals_name_their_field(overrides, field):
    settings = {"algorithm": "distill", "teacher_url": "http://127.0.0.1:1/v1", **overrides}
    with pytest.raises(ValueError, match=f"config field '{field}' must be"):
        RLConfig(**settings)
