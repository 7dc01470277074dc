import pytest
import transformers

transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_error()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Llama + char tokenizer saved as a local HF directory (no download)."""
    from rlhfkit.tasks.tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
