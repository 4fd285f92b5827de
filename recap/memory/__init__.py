"""`recap.memory`: what the recycling drafters (RECAP and Token Recycling) learn from the target.

- `records`: a prediction record (the target's top-k at one position) and its array form.
- `key_index`: packed context keys -> table rows (the contextual memories' hash index).
- `persistent`: ``P1``, the 1-token memory kept across requests, and its file format.
- `context`: ``C2`` / ``C3``, the 2- and 3-token contextual memories.
- `backoff`: the stream's most often committed tokens (the n-gram back-off's last level).
- `guarded`: a memory with a lock of its own that can still be copied.
- `recycling`: which computed position is written under which context keys.
- `estimates`: online acceptance estimates of drafted candidates, by kind.
- `continuations`: the contexts earlier answers continued in different ways (where RECAP fans).

Only RECAP (`recap.drafters.recap`) reads `context`, `backoff`, `continuations` and `estimates`; what a
RECAP stream keeps of them is owned beside the method (`recap.drafters.recap.stream.StreamMemory`, whose
field ``tokens`` is the `persistent.PersistentMemory`). They still live here because
`recycling.recycle` (RECAP's compiled write of P1, C2 and C3 plus its count of the acceptance labels)
imports `context` and `estimates`, and `recycling.recycling_keys` serves Token Recycling and the hot
start too: moving the four modules first needs `recycle` split from `recycling` into the method.
"""
