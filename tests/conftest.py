import os

import pytest
import torch
import transformers

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `pytest -n N` (the Makefile's test targets): N worker processes share the machine's cores, so
    # each computes with one thread (intra-op threads would only contend with the other workers).
    torch.set_num_threads(1)

transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_error()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Llama + char tokenizer saved as a local HF directory (no download)."""
    from rlhfkit.tasks.tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy 2-core machine OpenMP threads
    that spin waiting for each other made a test file ~40x slower; restored afterwards. A file
    opts in with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture()
def engine_threads():
    """Tests of a real engine (vLLM) compute with the machine's two cores when they run alone, and
    with one thread in each of `make`'s two pytest-xdist workers (two threads each would make four
    on two cores)."""
    torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)


# TRL's own test files (tests/trl_upstream/upstream) run only through their harness, with its own pytest.ini
# (make test-trl): never in rlhfkit's suite.
collect_ignore = ["trl_upstream"]
