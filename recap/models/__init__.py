"""`recap.models`: the only code that imports transformers (lazily, when a model is loaded or a
request starts): `adapter` (`TargetModel`, the decode loop's four verbs over a Hugging Face model) and
`kv_cache` (`GrowingCache`, the decode loop's KV cache)."""

from recap.models.adapter import TargetModel, supported_attention

__all__ = ["TargetModel", "supported_attention"]
