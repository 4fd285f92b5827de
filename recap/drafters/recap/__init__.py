"""RECAP, the method: memories fused by entropy-confidence weighting, a best-first draft tree.

- `drafter`: `RecapDrafter` (begin / propose / observe).
- `config`: `RecapConfig` and the ablations.
- `fusion`: entropy-confidence weighting of the memories' records.
- `search`: the best-first tree search (Python side); `kernel`: its compiled body.
- `budget`: the cost-aware budget rule the search applies as it grows.
- `suffix_match`: the suffix-matched continuation, compiled; `chain`: the tree cut to its best chain.
- `stream`: `StreamMemory`, everything a stream keeps across requests (its 1-token memory one field).
- `context`: ``C2`` / ``C3``, the 2- and 3-token contextual memories.
- `backoff`: the stream's most often committed tokens (the n-gram back-off's last level).
- `continuations`: the contexts earlier answers continued in different ways (where the search fans).
- `estimates`: online acceptance estimates of drafted candidates, by kind.
- `recycle`: a verified pass written into ``P1``, ``C2``, ``C3`` and its labels counted, in one compiled
  call (the keys: `recap.memory.recycling`).
- `mirror`: the request's tokens (and the stream's earlier ones) for the suffix match.

What RECAP shares with Token Recycling (records, the 1-token memory, the recycling keys) is in
`recap.memory`.
"""

from recap.drafters.recap.config import RecapConfig
from recap.drafters.recap.drafter import RecapDrafter

__all__ = ["RecapConfig", "RecapDrafter"]
