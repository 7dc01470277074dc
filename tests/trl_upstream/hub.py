"""The Hugging Face Hub's tiny test models that TRL's tests load, rebuilt offline.

TRL's tests load ``trl-internal-testing/tiny-*`` models by Hub id. Nothing can be downloaded here, so this
module builds them the way TRL's ``scripts/generate_tiny_models`` does (the same classes, widths, dtype and
weight initialisation) and writes them into a Hugging Face cache directory, where ``from_pretrained`` finds
them with ``HF_HUB_OFFLINE=1`` exactly as it finds a downloaded model.

The tokenizers keep the real ones' ids (TRL's tests hard-code ids such as 151645 for ``<|im_end|>``): the
byte-level BPE vocabulary and merges of Qwen2 come from llama.cpp's vocabulary file
``ggml-vocab-qwen2.gguf`` (shipped in the ``llama-cpp-python`` source package on PyPI), the added tokens are
Qwen2.5's and Qwen3's in their published order, and the chat templates are the originals TRL ships in
``trl/chat_templates``. Only the models below are rebuilt; a test that loads another id fails to load it in
both runs (TRL's and the drop-in's), so it is outside the comparison (``README.md``).
"""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

ORG = "trl-internal-testing"
LLAMA_CPP_SDIST = "llama-cpp-python==0.3.36"
QWEN2_VOCAB_MEMBER = "vendor/llama.cpp/models/ggml-vocab-qwen2.gguf"
COMMIT = "0" * 40  # the snapshot's name in the cache (any hash-shaped name is read)

# Qwen2.5's added tokens from id 151643 on, and which of them are special (tokenizer_config.json of Qwen2.5).
QWEN25_ADDED = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
    ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False),
]  # fmt: skip
QWEN3_ADDED = QWEN25_ADDED + [
    ("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False),
]  # fmt: skip

# id -> (architecture, tokenizer, chat template in trl/chat_templates, config overrides, head)
MODELS = {
    "tiny-Qwen2ForCausalLM-2.5": ("qwen2", QWEN25_ADDED, "qwen2_5.jinja", {"hidden_size": 8}, "causal"),
    "tiny-Qwen2ForSequenceClassification-2.5": (
        "qwen2", QWEN25_ADDED, "qwen2_5.jinja", {"hidden_size": 16, "num_labels": 1}, "classifier",
    ),
    "tiny-Qwen3ForCausalLM": ("qwen3", QWEN3_ADDED, "qwen3_training.jinja", {"hidden_size": 8}, "causal"),
    "tiny-Qwen3ForSequenceClassification": (
        "qwen3", QWEN3_ADDED, "qwen3.jinja", {"hidden_size": 16, "num_labels": 1}, "classifier",
    ),
}  # fmt: skip


def qwen2_vocab_file(cache: Path) -> Path:
    """llama.cpp's Qwen2 vocabulary (a GGUF file with no weights), unpacked from PyPI's llama-cpp-python sdist."""
    target = cache / "ggml-vocab-qwen2.gguf"
    if target.exists():
        return target
    import subprocess
    import sys

    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", LLAMA_CPP_SDIST,
         "-d", str(cache)],
        check=True,
    )  # fmt: skip
    sdist = next(cache.glob("llama_cpp_python-*.tar.gz"))
    with tarfile.open(sdist) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(QWEN2_VOCAB_MEMBER))
        data = tar.extractfile(member)
        assert data is not None
        target.write_bytes(data.read())
    sdist.unlink()
    return target


def qwen_base(vocab_file: Path) -> dict:
    """The ``tokenizers`` spec of Qwen2's byte-level BPE from the GGUF vocabulary: ids 0..151642, no added tokens."""
    from transformers import AutoTokenizer

    gguf = AutoTokenizer.from_pretrained(str(vocab_file.parent), gguf_file=vocab_file.name)
    spec = json.loads(gguf.backend_tokenizer.to_str())
    spec["model"]["vocab"] = {t: i for t, i in spec["model"]["vocab"].items() if i < 151643}
    assert len(spec["model"]["vocab"]) == 151643 and len(spec["model"]["merges"]) == 151387, "not Qwen2's vocabulary"
    return spec


def qwen_tokenizer(base: dict, added: list[tuple[str, bool]], template: str):
    """Qwen's tokenizer: the base BPE ids 0..151642, then ``added`` in order; eos ``<|im_end|>``, pad
    ``<|endoftext|>``."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    spec = dict(base)
    spec["added_tokens"] = [
        {"id": 151643 + k, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": special}
        for k, (text, special) in enumerate(added)
    ]  # fmt: skip
    spec["normalizer"] = {"type": "NFC"}
    spec["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = template
    return tokenizer


def build_model(name: str, tokenizer):
    import torch
    from torch import nn
    from transformers import (
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen2ForSequenceClassification,
        Qwen3Config,
        Qwen3ForCausalLM,
        Qwen3ForSequenceClassification,
    )

    arch, _, _, overrides, head = MODELS[name]
    config_class = {"qwen2": Qwen2Config, "qwen3": Qwen3Config}[arch]
    config = config_class(
        vocab_size=len(tokenizer.get_vocab()),
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        intermediate_size=32,
        pad_token_id=tokenizer.pad_token_id,
        **overrides,
    )
    model_class = {
        ("qwen2", "causal"): Qwen2ForCausalLM,
        ("qwen2", "classifier"): Qwen2ForSequenceClassification,
        ("qwen3", "causal"): Qwen3ForCausalLM,
        ("qwen3", "classifier"): Qwen3ForSequenceClassification,
    }[arch, head]
    torch.manual_seed(0)
    model = model_class(config).to(dtype=torch.bfloat16)
    for module in model.modules():  # TRL's init_weights_tiny_model: no NaNs from uninitialised weights
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
    return model


def build_hub(hub_cache: Path, downloads: Path) -> Path:
    """Every model of ``MODELS`` in ``hub_cache`` (a Hugging Face cache directory); built once, then reused."""
    import trl
    from transformers import GenerationConfig

    templates = Path(trl.__file__).parent / "chat_templates"
    base = None
    for name, (_, added, template, _, _) in MODELS.items():
        repo = hub_cache / f"models--{ORG}--{name}"
        snapshot = repo / "snapshots" / COMMIT
        if (snapshot / "config.json").exists():
            continue
        base = base or qwen_base(qwen2_vocab_file(downloads))
        tokenizer = qwen_tokenizer(base, added, (templates / template).read_text())
        model = build_model(name, tokenizer)
        snapshot.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(snapshot)
        tokenizer.save_pretrained(snapshot)
        config = json.loads((snapshot / "tokenizer_config.json").read_text())
        config["tokenizer_class"] = "Qwen2Tokenizer"
        (snapshot / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
        GenerationConfig(
            bos_token_id=151643, pad_token_id=151643, eos_token_id=[151645, 151643], do_sample=True,
            temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05,
        ).save_pretrained(snapshot)  # fmt: skip
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(COMMIT)
    return hub_cache


if __name__ == "__main__":
    from hub_data import build_datasets

    cache = Path(os.environ.get("TRL_UPSTREAM_CACHE", Path(__file__).parents[2] / ".cache" / "trl-upstream"))
    print(build_hub(cache / "hub", cache / "downloads"), build_datasets(cache / "datasets"))
