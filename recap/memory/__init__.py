"""`recap.memory`: what the recycling drafters (RECAP and Token Recycling) share of what they learn.

- `records`: a prediction record (the target's top-k at one position) and its array form.
- `persistent`: ``P1``, the 1-token memory kept across requests, and its file format.
- `recycling`: which computed position is written under which context keys, in which order.
- `key_index`: packed context keys -> table rows (a hash index compiled code reads).
- `guarded`: a memory with a lock of its own that can still be copied.
- `fingerprint`: the tag of a memory file (tokenizer and weights).

What only RECAP learns lives beside the method, in `recap.drafters.recap`: the contextual memories
(`context`), the back-off record (`backoff`), the open contexts (`continuations`), the acceptance
estimates (`estimates`), its compiled write of a pass (`recycle`) and the stream that owns them all
(`stream.StreamMemory`, whose field ``tokens`` is the `persistent.PersistentMemory`).
"""
