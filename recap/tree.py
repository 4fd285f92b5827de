"""Draft trees: the candidate continuations that one target pass verifies.

A `DraftTree` is a parents array. Node ``i`` holds one proposed token; ``parents[i]`` is the index of
its parent node, or ``-1`` when its parent is the *root*. The root is not a node: it stands for the
last committed token, whose logits the verification pass computes together with the nodes.

Invariants (checked by `validate`, kept by `add`):
- ``parents[i] < i`` (parents come before children), so ``depth`` and paths follow in one sweep;
- siblings hold distinct tokens (`add` merges a duplicate into the existing node and keeps both sources).

Everything else (depths, attention mask, root-to-node paths) is derived. No torch here.

Example::

    tree = DraftTree()
    a = tree.add(5, parent=-1, score=0.9, sources=("ctx2",))
    tree.add(7, parent=a, score=0.5, sources=("persistent",))
    tree.path(1)          # [5, 7]
    tree.depths           # array([1, 2])
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

ROOT = -1


@dataclass(frozen=True)
class Source:
    """What may propose a token: its name in trees and step records, a colour, and what it means."""

    name: str
    color: str
    meaning: str


#: The one table of sources, in display order. Drafters name their nodes' sources from it; ``target``
#: marks a token the target produced itself (a bonus token), ``unknown`` a node with no source. Colours
#: are the Okabe-Ito palette (distinguishable with the common colour-vision deficiencies); the studio's
#: legend, renderers and the explanation text all read this table.
SOURCE_TABLE: tuple[Source, ...] = (
    Source("ctx3", "#0072B2", "ctx3 · 3-token context"),
    Source("ctx2", "#56B4E9", "ctx2 · 2-token context"),
    Source("persistent", "#E69F00", "persistent · 1-token"),
    Source("suffix", "#009E73", "suffix match"),
    Source("backoff", "#000000", "back-off · the stream's most frequent tokens"),
    Source("template", "#CC79A7", "TR template"),
    Source("lookup", "#D55E00", "prompt lookup"),
    Source("suffix tree", "#F0E442", "SuffixDecoding tree"),
    Source("target", "#B8B8B8", "target (bonus)"),
    Source("unknown", "#7F7F7F", "unknown"),
)

#: Every source name that may propose a node (``target`` and ``unknown`` are for step records only).
SOURCES: tuple[str, ...] = tuple(s.name for s in SOURCE_TABLE if s.name not in ("target", "unknown"))


def main_source(sources: Sequence[str], contributions: Mapping[str, float]) -> str:
    """The source credited with a node: the largest contributor, else the first listed, else ``unknown``.

    Example: ``main_source(("ctx2", "persistent"), {"ctx2": 0.1, "persistent": 0.3}) == "persistent"``.
    """
    if contributions:
        return max(contributions, key=contributions.get)
    return sources[0] if sources else "unknown"


@dataclass(frozen=True)
class FusedCandidate:
    """One token of a drafter's belief at the root: fused probability and each source's share of it."""

    token: int
    prob: float
    contributions: Mapping[str, float] = field(default_factory=dict)


@dataclass
class DraftTree:
    """Parallel arrays describing a token tree under the root (the last committed token)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    sources: list[tuple[str, ...]] = field(default_factory=list)
    contributions: list[dict[str, float]] = field(default_factory=list)
    # The display-only fields below stay on the tree: a drafter that `Explains` writes them on the tree
    # it proposed (between `propose` and `observe`), SuffixDecoding's draft comes with its root
    # candidates, and the loop copies them into the step record (`recap.decode`); drafting never reads them.
    #: What the drafter believed at the root (for display); empty when it has no distribution.
    root_candidates: list[FusedCandidate] = field(default_factory=list)
    #: For display: per node, whether a record this request wrote (under its image) proposed it; empty
    #: when the drafter does not say.
    this_request: list[bool] = field(default_factory=list)
    #: For display: per node queued in a fan (`recap.drafters.recap.continuations`), how many ways earlier
    #: answers went on after its context; 0: not in a fan.
    fans: list[int] = field(default_factory=list)

    # Children index: (parent, token) -> node id, kept in sync by `add`.
    _child: dict[tuple[int, int], int] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        # A tree given as arrays gets its children index (duplicates are caught by `validate`).
        if self.tokens and not self._child:
            self._child = {(p, t): i for i, (p, t) in enumerate(zip(self.parents, self.tokens))}

    def __len__(self) -> int:
        return len(self.tokens)

    # ----------------------------------------------------------------------------------------- building
    def add(
        self,
        token: int,
        parent: int = ROOT,
        score: float = 0.0,
        sources: Iterable[str] = (),
        contributions: Mapping[str, float] | None = None,
    ) -> int:
        """Add ``token`` under ``parent`` and return its node id.

        If ``parent`` already has a child with this token, nothing new is created: the existing node
        gains the new sources and contributions, keeps the higher score, and its id is returned.
        """
        if parent != ROOT and not 0 <= parent < len(self.tokens):
            raise IndexError(f"parent {parent} is not a node of this tree (size {len(self.tokens)})")
        token = int(token)
        existing = self._child.get((parent, token))
        if existing is not None:
            merged = self.sources[existing] + tuple(s for s in sources if s not in self.sources[existing])
            self.sources[existing] = merged
            for name, share in (contributions or {}).items():
                self.contributions[existing].setdefault(name, float(share))
            self.scores[existing] = max(self.scores[existing], float(score))
            return existing
        node = len(self.tokens)
        self.tokens.append(token)
        self.parents.append(int(parent))
        self.scores.append(float(score))
        self.sources.append(tuple(sources))
        self.contributions.append({k: float(v) for k, v in (contributions or {}).items()})
        self._child[(parent, token)] = node
        return node

    def add_chain(
        self, tokens: Sequence[int], sources: Iterable[str] = (), score: float = 0.0, limit: int | None = None
    ) -> list[int]:
        """Insert ``tokens`` as a chain under the root, merging with nodes that already hold them.

        At most ``limit`` *new* nodes are created; the chain stops where that budget runs out.
        Returns the node ids along the inserted chain.
        """
        sources = tuple(sources)
        parent, ids, created = ROOT, [], 0
        for token in tokens:
            known = self._child.get((parent, int(token)))
            if known is None:
                if limit is not None and created >= limit:
                    break
                created += 1
            parent = self.add(token, parent, score=score, sources=sources)
            ids.append(parent)
        return ids

    def truncated(self, size: int) -> DraftTree:
        """A copy holding only nodes ``0 .. size-1`` (a valid tree: parents come before children)."""
        tree = DraftTree(
            self.tokens[:size],
            self.parents[:size],
            self.scores[:size],
            self.sources[:size],
            [dict(c) for c in self.contributions[:size]],
            list(self.root_candidates),
        )
        tree._child = {key: node for key, node in self._child.items() if node < size}
        return tree

    def child(self, parent: int, token: int) -> int | None:
        """The node holding ``token`` under ``parent`` (``ROOT`` for the root), or None."""
        return self._child.get((parent, int(token)))

    # ------------------------------------------------------------------------------------------ derived
    @property
    def depths(self) -> np.ndarray:
        """Depth of each node; the root's children have depth 1. Shape ``(n,)``, int64."""
        depth = np.zeros(len(self.tokens), dtype=np.int64)
        for i, parent in enumerate(self.parents):
            depth[i] = 1 if parent == ROOT else depth[parent] + 1
        return depth

    def ancestor_mask(self) -> np.ndarray:
        """Boolean ``(n, n)``: ``mask[i, j]`` is True when node ``j`` is node ``i`` or an ancestor of it."""
        n = len(self.tokens)
        mask = np.zeros((n, n), dtype=bool)
        for i, parent in enumerate(self.parents):
            if parent != ROOT:
                mask[i] = mask[parent]
            mask[i, i] = True
        return mask

    def path(self, node: int) -> list[int]:
        """Tokens from the root's first child down to ``node`` (inclusive)."""
        tokens = []
        while node != ROOT:
            tokens.append(self.tokens[node])
            node = self.parents[node]
        return tokens[::-1]

    def path_nodes(self, node: int) -> list[int]:
        """Node ids from depth 1 down to ``node`` (inclusive)."""
        nodes = []
        while node != ROOT:
            nodes.append(node)
            node = self.parents[node]
        return nodes[::-1]

    def children(self, parent: int) -> list[int]:
        """Node ids whose parent is ``parent``, in insertion order."""
        return [i for i, p in enumerate(self.parents) if p == parent]

    def validate(self) -> None:
        """Raise ``ValueError`` if an invariant is broken (parents before children, unique siblings)."""
        arrays = (self.parents, self.scores, self.sources, self.contributions)
        if any(len(a) != len(self.tokens) for a in arrays):
            raise ValueError("DraftTree arrays have different lengths")
        seen: set[tuple[int, int]] = set()
        for i, (parent, token) in enumerate(zip(self.parents, self.tokens)):
            if not (parent == ROOT or 0 <= parent < i):
                raise ValueError(f"node {i} has parent {parent}: parents must come before children")
            if (parent, token) in seen:
                raise ValueError(f"node {i}: token {token} appears twice under parent {parent}")
            seen.add((parent, token))
