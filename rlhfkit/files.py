"""Writing files so that a failure names the file: a full disk says which file it could not write."""

from __future__ import annotations

import os
from contextlib import contextmanager


@contextmanager
def writing(path):
    """An ``OSError`` raised inside that names no file (a write or close on a full disk: "No space
    left on device") names ``path``; so does a safetensors I/O error (``... (os error 28)``)."""
    try:
        yield
    except OSError as err:
        if err.filename:
            raise
        raise OSError(err.errno, err.strerror or str(err), str(path)) from None
    except Exception as err:  # safetensors' Rust writer: SafetensorError("... I/O error: ... (os error N)")
        text = str(err)
        if "(os error " not in text:
            raise
        code = text.rsplit("(os error ", 1)[1].split(")", 1)[0]
        if not code.isdigit():
            raise
        raise OSError(int(code), os.strerror(int(code)), str(path)) from None


def write_text_atomic(path, text: str) -> None:
    """``text`` into ``path`` whole or not at all: written to a temporary file beside it and renamed
    over it, so an interrupted or failed write never leaves half a file (an OS error names ``path``)."""
    path = str(path)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with writing(path), open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
