"""The drop-in classes (``rlhfkit.trl``) against TRL 1.16 itself: every test here is marked ``trl``
and runs in ``.venv-trl`` (``make test-trl``), where TRL is installed beside rlhfkit. Each runs one
optimizer step (or two) of TRL's trainer and of rlhfkit's drop-in twin from the same tiny model,
data and config, and compares the weights after it (``harness.update_difference``)."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # the tests import harness.py beside this file


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).parent == here:
            item.add_marker(pytest.mark.trl)


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models gain nothing from intra-op threads (and two xdist workers share two cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """The tiny random Llama and char tokenizer both trainers start from (a local HF directory)."""
    from rlhfkit.tasks.tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)
