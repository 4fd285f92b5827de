"""Traces a stranger could upload to the studio's Replay, each as costly as the bounds of
`recap.studio.guard.trace_files` allow for its kind (and one beyond them): what `scripts.space_attack`
sends to a running studio, and what `tests/test_drawing.py` and `tests/test_space_limits.py` read and
draw.

    from scripts.hostile_traces import SHAPES, crafted
    crafted(Path("/tmp/wide.json"), "wide")
"""

from __future__ import annotations

import json
from pathlib import Path

#: The crafted traces: ``largest`` is over the values bound (refused before parsing); the others are just
#: within every bound of `recap.studio.guard.trace_files`, each the costliest of its kind to read or to draw.
SHAPES = ("largest", "strings", "tokens", "nodes", "sources", "wide", "long", "draws")


def crafted(path: Path, shape: str) -> Path:
    """A trace of ``shape`` (`SHAPES`): ``largest`` (255 steps x 8192 tokens, 15.96 MiB), or one just
    within the limits of the kind that costs most to read (``strings``: ~790k distinct short strings;
    ``tokens``: 4096 tokens of 200k characters; ``nodes``: four 8192-node chains) or to draw
    (``sources``: 4096 one-token steps, each token from a source of its own with a 1000-character name;
    ``wide``: 8192 nodes under the root, each with 1000 characters of text and a source of its own,
    and a bonus token; ``long``: an 8192-node chain of 1000-character texts, each node naming 8 sources;
    ``draws``: a sampled step whose 8192 nodes of 1000 characters are tried ~91,000 times)."""

    def node(i, sources=("ctx3",), parent=None, text="a", token=1):
        parent = i - 1 if parent is None else parent
        depth = 1 if parent == -1 else i + 1
        return {"id": i, "parent": parent, "token": token, "text": text, "depth": depth, "score": 0.5,
                "sources": list(sources), "contributions": {}, "accepted": False}  # fmt: skip

    def step(i, **fields):
        return {"step": i, "committed_len": i, "method": "recap", **fields}

    def long_text(i: int) -> str:
        return f"{i:x}".rjust(1000, "w")

    if shape == "largest":
        tokens = {"new_tokens": [7] * 8192, "new_texts": [""] * 8192, "new_sources": [""] * 8192}
        steps = [step(i, **tokens) for i in range(255)]
    elif shape == "strings":
        steps = [step(i, nodes=[node(0, [f"{8000 * i + j:x}" for j in range(8000)])]) for i in range(99)]
    elif shape == "tokens":
        texts = {"new_tokens": [5] * 16, "new_sources": ["target"] * 16}
        steps = [step(i, new_texts=["é" * 46 + f"{i:02x}"] * 16, **texts) for i in range(256)]
    elif shape == "sources":
        steps = [step(i, new_tokens=[5], new_texts=["a"], new_sources=[long_text(i)]) for i in range(4096)]
    elif shape == "wide":
        nodes = [node(i, [long_text(i)[-200:]], parent=-1, text=long_text(i), token=i) for i in range(8192)]
        bonus = {"bonus_token": 1, "new_tokens": [1], "new_texts": ["b"], "new_sources": ["target"]}
        first = {"new_tokens": [1], "new_texts": ["a"], "new_sources": ["target"]}
        steps = [step(0, **first), step(1, nodes=nodes, **bonus)]
    elif shape == "long":
        names = [f"source {j}" for j in range(8)]
        nodes = [node(i, names, text=long_text(i), token=i) for i in range(8192)]
        steps = [step(0, nodes=nodes)]
    elif shape == "draws":
        nodes = [node(i, parent=-1, text=long_text(i), token=i) for i in range(8192)]
        draws = [{"tried": [[(d * 23 + j) % 8192, 0.01] for j in range(23)], "token": d % 8192,
                  "residual": False} for d in range(3900)]  # fmt: skip
        steps = [step(0, nodes=nodes, draws=draws)]
    else:
        steps = [step(i, nodes=[node(j) for j in range(8192)]) for i in range(4)]
    data = {"version": 1, "settings": {"method": "recap"}, "steps": steps}
    path.write_text(json.dumps(data, separators=(",", ":"), ensure_ascii=False), encoding="utf-8")
    return path
