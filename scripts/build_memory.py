"""Build the warmed persistent memory that ships for an embedded model (the studio's and CLI's hot start).

    python -m scripts.build_memory --model v2   # v2 (default): assets/memory/tiny-scenes-llava-v2.safetensors
    python -m scripts.build_memory --model v1   # v1: writes assets/memory/tiny-scenes-llava.safetensors

The target decodes ``--requests`` questions about TRAINING scenes of its own world
(`recap.embedded.training_requests`: v1's `recap.embedded.scenes` or v2's `recap.embedded.scenes2`, seeds 0
.. n-1, below
the held-out range the benchmark and the studio's examples draw from; RECAP with a fixed budget
drafts, only to make it fast). Each token's record is the target's next-token
distribution averaged over every committed position ending in that token (`AveragedRecords`: the
answers do not depend on the drafter, so neither does the memory), saved with `PersistentMemory.save`
and tagged with the model's fingerprint (tokenizer and weights digest). A JSON
file beside it records how it was built. Rerun this whenever the embedded model changes: a memory built
for another model is not loaded (the studio and CLI log it and start cold).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from recap.drafters.recap.config import RecapConfig
from recap.embedded import embedded_world, scenes, training_requests
from recap.hotstart import (
    SHIPPED_K,
    SHIPPED_MEMORY_DIR,
    AveragedRecords,
    warm_up,
)
from recap.memory.fingerprint import model_fingerprint
from recap.memory.persistent import PersistentMemory
from recap.runtime import EMBEDDED_MODEL, EMBEDDED_MODEL_V1, EMBEDDED_MODEL_V2, Runtime
from recap.state import DrafterState

#: Defaults: 200 requests (50 per question type of v1, 33-34 of v2's six); the build's tree budget.
REQUESTS = 200
BUDGET = 16
#: Tokens per answer: v1's answers are short; v2's detailed descriptions run to 150 tokens.
MAX_NEW_TOKENS = {"scenes": 64, "scenes2": 160}
#: ``--model`` names of the embedded models.
MODELS = {"v1": EMBEDDED_MODEL_V1, "v2": EMBEDDED_MODEL_V2}


def model_folder(model: str | Path) -> Path:
    """``v1`` / ``v2`` (the embedded models) or a model folder."""
    return MODELS.get(str(model), Path(model))


def world_of(folder: Path):
    """The scene world whose training scenes warm ``folder``'s memory: an embedded model's own, else v1's."""
    return embedded_world(folder) or scenes


def build(
    model: str | Path = EMBEDDED_MODEL,
    out: str | Path | None = None,
    requests: int = REQUESTS,
    budget: int = BUDGET,
    max_new_tokens: int | None = None,
) -> dict:
    """Warm a memory on ``requests`` training scenes of the model's world and save it to ``out``
    (default: the shipped path of ``model``'s folder); returns the build record written beside it
    (``<out>.json``). ``model``: ``v1``, ``v2`` or a model folder; ``max_new_tokens``: the world's
    default when None."""
    folder = model_folder(model)
    world = world_of(folder)
    name = world.__name__.rsplit(".", 1)[-1]
    max_new_tokens = max_new_tokens or MAX_NEW_TOKENS[name]
    runtime = Runtime.load(str(folder))
    out = Path(out) if out is not None else SHIPPED_MEMORY_DIR / f"{folder.resolve().name}.safetensors"
    vocab = runtime.target.vocab_size
    config = RecapConfig(budget=budget, k=SHIPPED_K)  # RECAP only makes the build fast
    memory = DrafterState.given(vocab, persistent=PersistentMemory(vocab, SHIPPED_K))
    drafter = runtime.drafter("recap", config=config, state=memory)
    averaged = AveragedRecords(drafter, vocab)
    report = warm_up(runtime.target, averaged, training_requests(world, requests), max_new_tokens)
    memory = averaged.memory()
    fingerprint = model_fingerprint(runtime.target)
    memory.save(out, fingerprint)
    out.chmod(0o644)  # the save's temporary file was private to its writer
    alias = next((key for key, path in MODELS.items() if path.resolve() == folder.resolve()), None)
    record = {
        "model": folder.resolve().name,
        "fingerprint": fingerprint,
        "command": "python -m scripts.build_memory "
        + f"--model {alias or folder} "
        + f"--requests {requests} --budget {budget} --max-new-tokens {max_new_tokens}",
        "world": name,
        "requests": requests,
        "scene_seeds": [0, requests - 1],
        "question_types": f"{', '.join(world.QUESTION_TYPES)} in turn (training templates)",
        "records": "each token's top-k averaged over every committed position ending in it",
        "budget": budget,
        "max_new_tokens": max_new_tokens,
        "tokens_generated": report.tokens,
        "tokens_known": len(memory),
        "vocab_size": runtime.target.vocab_size,
        "k": SHIPPED_K,
        "bytes": out.stat().st_size,
        "seconds": round(report.seconds, 1),
    }
    out.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.build_memory", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--model", default="v2", help="v2 or v1 (the embedded models) or a model folder (default: v2)"
    )
    parser.add_argument(
        "--out", default=None, help="memory file (default: assets/memory/<model folder>.safetensors)"
    )
    parser.add_argument("--requests", type=int, default=REQUESTS, help="training-scene requests to decode")
    parser.add_argument("--budget", type=int, default=BUDGET, help="fixed tree budget of the build's passes")
    parser.add_argument(
        "--max-new-tokens", type=int, default=None, help="tokens per answer (default: 64 for v1, 160 for v2)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.budget < 1 or (args.max_new_tokens or 1) < 1 or args.threads < 1:
        print(
            "error: --requests, --budget, --max-new-tokens and --threads must be at least 1", file=sys.stderr
        )
        return 2
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    try:
        record = build(args.model, args.out, args.requests, args.budget, args.max_new_tokens)
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(
        f"{record['tokens_known']} tokens known after {record['requests']} training-scene requests "
        f"({record['tokens_generated']} tokens generated); {record['bytes']} bytes; "
        f"{time.perf_counter() - start:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
