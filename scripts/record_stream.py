"""Record a drafter's stream (what it was shown and what it proposed) for replay without a model.

The stream is the embedded model v1's on v1's held-out scenes (the recorded file's). A drafter's
trees depend only on what it observed before (with a fixed budget: no timing enters), so
a recorded stream replays exactly: begin each request, feed every observation, and compare every
proposed tree with the recorded one. ``tests/test_stream_replay.py`` does that for RECAP on the
stream in ``tests/data/``, so a faster implementation must draft the very same trees.

    python -m scripts.record_stream --limit 20 --budget 80 --out tests/data/recap_scenes_stream.npz

The file (``numpy.savez_compressed``) holds flat arrays with offsets (`StreamRecording.to_arrays`);
`load_stream` turns it back into a list of events.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from recap.drafters.base import Drafter, Observation, RequestInfo
from recap.tree import DraftTree
from recap.verify import Acceptance


@dataclass
class _Event:
    kind: str  # "begin", "propose" or "observe"
    payload: Any


@dataclass
class StreamRecording:
    """A drafter wrapper that records every call (`Drafter` protocol, forwarding to ``inner``)."""

    inner: Drafter
    events: list[_Event] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def record_k(self) -> int:
        return self.inner.record_k

    def begin(self, request: RequestInfo) -> None:
        self.events.append(_Event("begin", request))
        self.inner.begin(request)

    def propose(self, context: Sequence[int]) -> DraftTree:
        tree = self.inner.propose(context)
        self.events.append(_Event("propose", (list(context), tree)))
        return tree

    def observe(self, observation: Observation) -> None:
        # The decode loop extends its context list after this call: keep a copy.
        frozen = Observation(
            list(observation.context),
            np.asarray(observation.positions).copy(),
            observation.tree,
            observation.topk_ids,
            observation.topk_probs,
            observation.acceptance,
        )
        self.events.append(_Event("observe", frozen))
        self.inner.observe(observation)

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Flat arrays: one row per event in ``kind`` (0 begin, 1 propose, 2 observe) and ragged
        fields as ``NAME`` (concatenated) + ``NAME_len`` (length per event)."""
        columns: dict[str, list] = {}

        def put(name: str, values: Any) -> None:
            values = np.asarray(values)
            columns.setdefault(name, []).append(values)
            columns.setdefault(f"{name}_len", []).append(len(values))

        sources: list[str] = []
        kinds, vocab = [], []
        for event in self.events:
            if event.kind == "begin":
                request: RequestInfo = event.payload
                kinds.append(0)
                vocab.append(request.vocab_size)
                put("prompt", np.asarray(request.prompt_tokens, dtype=np.int64))
                put("excluded", np.asarray(sorted(request.excluded_tokens), dtype=np.int64))
                put("eos", np.asarray(sorted(request.eos_ids), dtype=np.int64))
            elif event.kind == "propose":
                context, tree = event.payload
                kinds.append(1)
                put("context", np.asarray(context, dtype=np.int64))
                put("tree_tokens", np.asarray(tree.tokens, dtype=np.int64))
                put("tree_parents", np.asarray(tree.parents, dtype=np.int64))
                put("tree_scores", np.asarray(tree.scores, dtype=np.float64))
                codes = []
                for names in tree.sources:
                    text = "+".join(names)
                    if text not in sources:
                        sources.append(text)
                    codes.append(sources.index(text))
                put("tree_sources", np.asarray(codes, dtype=np.int64))
            else:
                observation: Observation = event.payload
                kinds.append(2)
                put("obs_context", np.asarray(observation.context, dtype=np.int64))
                put("obs_positions", np.asarray(observation.positions, dtype=np.int64))
                put("obs_tree_tokens", np.asarray(observation.tree.tokens, dtype=np.int64))
                put("obs_tree_parents", np.asarray(observation.tree.parents, dtype=np.int64))
                put("topk_ids", np.asarray(observation.topk_ids, dtype=np.int32))
                put("topk_probs", np.asarray(observation.topk_probs, dtype=np.float32))
                accepted = observation.acceptance
                put("accepted_nodes", np.asarray(accepted.nodes if accepted else (), dtype=np.int64))
                put("accepted_tokens", np.asarray(accepted.tokens if accepted else (), dtype=np.int64))
                put("has_acceptance", np.asarray([accepted is not None]))
        arrays = {"kind": np.asarray(kinds, dtype=np.int8), "vocab": np.asarray(vocab, dtype=np.int64)}
        for name, parts in columns.items():
            arrays[name] = np.asarray(parts) if name.endswith("_len") else np.concatenate(parts)
        arrays["source_names"] = np.asarray(json.dumps(sources))
        return arrays


def load_stream(path: str | Path) -> list[tuple[str, Any]]:
    """The events of a recorded stream: ``("begin", RequestInfo)``, ``("propose", (context, tree))``
    and ``("observe", Observation)``, in call order."""
    data = np.load(path)
    sources = [tuple(s.split("+")) if s else () for s in json.loads(str(data["source_names"]))]
    cursors: dict[str, int] = {}
    counts: dict[str, int] = {}

    def take(name: str) -> np.ndarray:
        index = counts.get(name, 0)
        length = int(data[f"{name}_len"][index])
        start = cursors.get(name, 0)
        counts[name], cursors[name] = index + 1, start + length
        return data[name][start : start + length]

    events: list[tuple[str, Any]] = []
    vocab = iter(data["vocab"].tolist())
    for kind in data["kind"].tolist():
        if kind == 0:
            events.append(
                (
                    "begin",
                    RequestInfo(
                        tuple(take("prompt").tolist()),
                        frozenset(take("excluded").tolist()),
                        next(vocab),
                        frozenset(take("eos").tolist()),
                    ),
                )
            )
        elif kind == 1:
            context = take("context").tolist()
            tokens, parents = take("tree_tokens").tolist(), take("tree_parents").tolist()
            scores = take("tree_scores").tolist()
            names = [sources[code] for code in take("tree_sources").tolist()]
            events.append(("propose", (context, DraftTree(tokens, parents, scores, names))))
        else:
            context, positions = take("obs_context").tolist(), take("obs_positions")
            tree = DraftTree(take("obs_tree_tokens").tolist(), take("obs_tree_parents").tolist())
            ids, probs = take("topk_ids"), take("topk_probs")
            nodes, committed = take("accepted_nodes").tolist(), take("accepted_tokens").tolist()
            acceptance = Acceptance(tuple(nodes), tuple(committed)) if take("has_acceptance")[0] else None
            events.append(("observe", Observation(context, positions, tree, ids, probs, acceptance)))
    return events


def main(argv: Sequence[str] | None = None) -> int:
    import torch

    from recap.bench.datasets import load_scenes
    from recap.bench.runner import _run_one
    from recap.drafters.recap.config import RecapConfig
    from recap.runtime import EMBEDDED_MODEL_V1, Runtime

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="recap")
    parser.add_argument("--limit", type=int, default=20, help="scenes (held-out set)")
    parser.add_argument("--budget", type=int, default=80)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    runtime = Runtime.load(str(EMBEDDED_MODEL_V1))  # v1's model for v1's scenes
    drafter = StreamRecording(runtime.drafter(args.method, budget=args.budget, config=RecapConfig()))
    for sample in load_scenes(args.limit):
        _run_one(runtime.target, drafter, sample, args.max_new_tokens, args.method)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **drafter.to_arrays())
    proposals = sum(event.kind == "propose" for event in drafter.events)
    size = Path(args.out).stat().st_size
    print(f"{args.out}: {len(drafter.events)} events, {proposals} trees, {size} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
