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

Only RECAP (`recap.drafters.recap`) reads `context`, `backoff`, `continuations` and `estimates`, yet
they live here: `persistent.PersistentMemory` carries them as the stream's shared state, and
`recycling.recycle` writes the contextual memories and counts the acceptance labels in its compiled
call. Beside the method they would be imported upwards, from this layer into the drafters.
"""
