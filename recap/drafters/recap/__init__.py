"""RECAP, the method: memories fused by entropy-confidence weighting, a best-first draft tree.

- `drafter`: `RecapDrafter` (begin / propose / observe).
- `config`: `RecapConfig` and the ablations.
- `fusion`: entropy-confidence weighting of the memories' records.
- `search`: the best-first tree search (Python side); `kernel`: its compiled body.
- `budget`: the cost-aware budget rule the search applies as it grows.
- `stream`: `StreamMemory`, everything a stream keeps across requests (its 1-token memory one field).
- `mirror`: the request's tokens (and the stream's earlier ones) for the suffix match.
"""

from recap.drafters.recap.config import RecapConfig
from recap.drafters.recap.drafter import RecapDrafter

__all__ = ["RecapConfig", "RecapDrafter"]
