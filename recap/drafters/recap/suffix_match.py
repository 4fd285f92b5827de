"""The suffix-matched continuation RECAP's compiled search offers (`recap.drafters.recap.kernel`).

`suffix_chain` finds the longest suffix of the context seen earlier in it and returns what followed
that earlier occurrence, as `recap.drafters.prompt_lookup.find_continuation` does, in compiled code so
that the search runs it once per pass without leaving numba.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def suffix_chain(tokens, length, usable, min_n, max_n, num):
    """The suffix-matched continuation of ``tokens[:length]``: `recap.drafters.prompt_lookup`'s
    ``find_continuation(tokens[:length], min_n, max_n, num, excluded)`` (the longest suffix of
    ``min_n``..``max_n`` tokens seen before, its most recent earlier occurrence, up to ``num`` tokens
    that followed it, cut before an excluded one or a separator, a negative token), with the excluded
    tokens those ``usable`` (token -> may appear in a key, ``len`` vocab + 1) marks False; ``num`` 0:
    none. One backward scan: at each earlier end, how many tokens agree with the suffix; the first end
    with the most wins (n-grams with an excluded token never match: the suffix compared holds none).

    Example: ``tokens = [1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3]``, ``min_n, max_n, num = 1, 3, 2``: ``[7, 1]``.
    """
    none = np.empty(0, dtype=np.int64)
    if num <= 0:
        return none
    vocab = len(usable) - 1
    longest = 0  # the suffix's length: at most max_n and length - 1 tokens, none of them excluded
    while longest < min(max_n, length - 1):
        token = tokens[length - 1 - longest]
        if token < 0 or (token < vocab and not usable[token]):  # (a negative token: a separator)
            break
        longest += 1
    best, best_end = 0, -1
    for end in range(length - 2, min_n - 2, -1):
        agree = 0
        while agree < longest and agree <= end and tokens[end - agree] == tokens[length - 1 - agree]:
            agree += 1
        if agree > best:
            best, best_end = agree, end
            if agree == longest:
                break
    if best < min_n:
        return none
    chain = np.empty(num, dtype=np.int64)
    size = 0
    for at in range(best_end + 1, min(best_end + 1 + num, length)):
        token = tokens[at]
        if token < 0 or (token < vocab and not usable[token]):
            break
        chain[size] = token
        size += 1
    return chain[:size]
