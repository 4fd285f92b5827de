"""A byte-level BPE tokenizer trained on a small corpus: the embedded model's and the tests' tiny models'.

Byte-level, so any text tokenizes (no unknown token); special tokens get the first ids, in order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def train_byte_level_bpe(corpus: Iterable[str], vocab_size: int, special_tokens: Sequence[str]):
    """A `tokenizers.Tokenizer` (byte-level BPE, no prefix space) trained on ``corpus``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    return tokenizer
