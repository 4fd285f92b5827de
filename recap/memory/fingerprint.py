"""What a memory file is tagged with: the model it was made for.

`model_fingerprint`: the tokenizer's fingerprint and, for a model in a local folder, a digest of its
weights (`weights_digest`: a retrained model with the same tokenizer does not load the old model's
memory); for a hub id, the id. `recap.memory.persistent.PersistentMemory` refuses a file whose tag
differs.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Protocol


class Fingerprinted(Protocol):
    """A loaded model as a memory's tag reads it (`recap.models.TargetModel` is one)."""

    name: str

    def fingerprint(self) -> str: ...


#: Bytes read from each end of a weight file for its digest (cheap even for a 7B model's folder).
DIGEST_BYTES = 1 << 20


def weights_digest(folder: str | Path) -> str:
    """A short digest of a model folder's weights: each weight file's name, size and first and last
    `DIGEST_BYTES`, plus ``config.json``. Retraining changes it; copying the folder elsewhere does not."""
    folder = Path(folder)
    digest = hashlib.sha256()
    weight_suffixes = {".safetensors", ".bin", ".gguf", ".pt", ".pth"}
    files = sorted(
        p
        for p in folder.iterdir()
        if p.is_file() and (p.suffix in weight_suffixes or p.name == "config.json")
    )
    for path in files:
        size = path.stat().st_size
        digest.update(f"{path.name}:{size}:".encode())
        with open(path, "rb") as handle:
            digest.update(handle.read(DIGEST_BYTES))
            if size > 2 * DIGEST_BYTES:
                handle.seek(-DIGEST_BYTES, 2)
                digest.update(handle.read(DIGEST_BYTES))
    return digest.hexdigest()[:16]


def model_fingerprint(target: Fingerprinted) -> str:
    """The tag of a memory file made for ``target``: tokenizer fingerprint plus the weights' digest (a
    local folder) or the model's name (a hub id). A file with another tag is not loaded."""
    return memory_tag(target.name, target.fingerprint())


def tokenizer_fingerprint(model_type: str, vocab_size: int, vocab: dict[str, int]) -> str:
    """Identifies a tokenizer (its vocabulary and special tokens, ``vocab`` as ``get_vocab()`` gives it)
    with the model's type and vocabulary size: saved memories must match it."""
    items = sorted(vocab.items(), key=lambda item: item[1])
    digest = hashlib.sha256(repr((items, vocab_size)).encode()).hexdigest()
    return f"{model_type}:{vocab_size}:{digest[:16]}"


def memory_tag(name: str, tokenizer: str) -> str:
    """The tag of a memory file for the model ``name`` (a folder or a hub id) whose tokenizer has the
    fingerprint ``tokenizer`` (`tokenizer_fingerprint`): whoever loads a model (this project's engine,
    the vLLM proposer) tags and checks its memories the same way."""
    folder = Path(name)
    if folder.is_dir():
        return f"{tokenizer}|weights:{weights_digest(folder)}"
    return f"{tokenizer}|model:{name}"
