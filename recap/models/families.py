"""What differs between model families, in one table: prompting, image tokens, positions, masks.

`FAMILIES` maps a config's ``model_type`` to a `Family` row: whether prompts carry images, which
tokens stand for image content, and the position scheme (`SequentialPositions` or
`MultimodalRope`). `TargetModel` reads only the row, so a new family, for example another mRoPE
model whose ``get_rope_index`` takes the same arguments (Qwen3-VL), is one line in the table.
`AttentionLayout` reads how a text config masks its layers (sliding windows, per-layer mask keys),
the way the family's modeling code in transformers reads it.

No transformers import here: position schemes call the loaded model's own methods.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

import torch


class PositionScheme(Protocol):
    """How a family numbers positions: for the prompt (computed per request), and for new tokens."""

    name: str

    def prompt(self, model: Any, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Position ids for the whole prompt and this request's offset for later tokens (or ``None``)."""
        ...

    def extend(self, sequence_positions: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
        """Position ids for new tokens at sequence indices ``(1, T)`` (a tree node: its path's index)."""
        ...


class SequentialPositions:
    """One position per token: position = sequence index (Llama, LLaVA, Idefics3, ...)."""

    name = "sequential"

    def prompt(self, model: Any, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, None]:
        input_ids = inputs["input_ids"]
        return torch.arange(input_ids.shape[1], device=input_ids.device)[None], None

    def extend(self, sequence_positions: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
        return sequence_positions


class MultimodalRope:
    """Qwen2/2.5-VL's mRoPE: three rows (time, height, width) of ids ``(3, 1, T)``.

    The prompt's rows come from the model's ``get_rope_index`` (image patches share positions, so
    text after an image sits at ``sequence index + rope delta``, the delta being negative); new
    tokens advance the three rows together from there. The delta is computed per request, never
    read from ``model.model.rope_deltas``, which is stale state from earlier calls.
    """

    name = "mrope"

    def prompt(self, model: Any, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        input_ids = inputs["input_ids"]
        device = input_ids.device
        if inputs.get("image_grid_thw") is None and inputs.get("video_grid_thw") is None:
            positions = torch.arange(input_ids.shape[1], device=device)[None, None].expand(3, 1, -1)
            return positions, torch.zeros(1, 1, dtype=torch.long, device=device)
        token_types = inputs.get("mm_token_type_ids")
        if token_types is None:  # older processors do not return it; without it positions are wrong
            config = model.config
            token_types = (input_ids == config.image_token_id).int()
            if getattr(config, "video_token_id", None) is not None:
                token_types = token_types + 2 * (input_ids == config.video_token_id).int()
        positions, deltas = model.model.get_rope_index(
            input_ids,
            mm_token_type_ids=token_types,
            image_grid_thw=inputs.get("image_grid_thw"),
            video_grid_thw=inputs.get("video_grid_thw"),
            attention_mask=inputs.get("attention_mask"),
        )
        return positions, deltas.reshape(1, 1).to(device)

    def extend(self, sequence_positions: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
        shifted = sequence_positions if offset is None else sequence_positions + offset
        return shifted[None].expand(3, 1, -1)


SEQUENTIAL = SequentialPositions()  # stateless, as every scheme: one instance serves every family


@dataclass(frozen=True)
class Family:
    """One row of the family table.

    ``vision``: prompts go through the processor's chat template with image placeholders (else the
    tokenizer's template, text only). ``image_tokens``: tokens that stand for image content (never
    drafting keys); ``image_token_prefix``: the prefix of more such tokens (Idefics3's tile markers
    ``<row_1_col_2>``). ``positions``: the position scheme. ``direct_decoder``: once the prompt is
    prefilled, the model's forward on text tokens is exactly input embedding -> decoder
    (``get_decoder()``) -> output embedding, with nothing else on the way (no logit soft-capping, no
    embedding scaling outside the embedding module), so decode passes may call those three directly and
    skip the wrapper's per-call overhead (about a tenth of a pass of the embedded model on one CPU
    thread). LLaVA and LLaVA-NeXT qualify whatever their text model (their wrappers compute the
    logits as ``lm_head(decoder(embed(ids)))``); Gemma2/3 do not (their wrappers soft-cap logits).
    """

    name: str
    vision: bool
    image_tokens: tuple[str, ...] = ()
    image_token_prefix: str | None = None
    positions: PositionScheme = SEQUENTIAL
    direct_decoder: bool = False


TEXT = Family("text", vision=False)
LLAVA = Family("llava", vision=True, image_tokens=("<image>",), direct_decoder=True)
IDEFICS3 = Family(
    "idefics3",
    vision=True,
    image_tokens=("<image>", "<fake_token_around_image>", "<global-img>"),
    image_token_prefix="<row_",
)
QWEN_VL = Family(
    "qwen_vl",
    vision=True,
    image_tokens=("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>", "<|vision_pad|>"),
    positions=MultimodalRope(),
)

#: model_type -> family: the one place that decides prompting, image tokens and positions.
FAMILIES: dict[str, Family] = {
    "qwen2_5_vl": QWEN_VL,
    "qwen2_vl": QWEN_VL,
    "llava": LLAVA,
    "llava_next": LLAVA,
    "idefics3": IDEFICS3,
    "smolvlm": IDEFICS3,
    **dict.fromkeys(
        ("gemma", "gemma2", "gemma3_text", "llama", "mistral", "phi3", "qwen2", "qwen3", "smollm3"), TEXT
    ),
}
SUPPORTED = sorted(FAMILIES, key=lambda t: (not FAMILIES[t].vision, t))  # vision model types first


def family_of(model_type: str) -> Family:
    """The family row of ``model_type``; raises ``ValueError`` naming the supported ones."""
    try:
        return FAMILIES[model_type]
    except KeyError:
        raise ValueError(
            f"unsupported architecture {model_type!r}; supported: {', '.join(SUPPORTED)}"
        ) from None


@dataclass(frozen=True)
class AttentionLayout:
    """How the text model masks its layers, read from its config the way its modeling code reads it.

    ``window``: the sliding window W, or ``None``: a query at sequence index q sees the keys at
    indices k with ``q - k < W`` (transformers' ``sliding_window_overlay``: ``kv_idx > q_idx - W``).
    ``layer_types``: the mask keys the model looks up when given a dict of masks
    (``"full_attention"`` / ``"sliding_attention"``: Qwen2/3, Qwen2-VL text, Gemma2/3, SmolLM3 take
    ``mask[config.layer_types[i]]`` per layer, so an all-sliding model looks up only one key), or
    ``None`` for models that apply one mask to every layer and cannot take a dict (Llama, Gemma,
    Mistral, Phi-3: sliding on every layer whenever ``sliding_window`` is set).
    """

    window: int | None
    layer_types: frozenset[str] | None

    @classmethod
    def of(cls, text_config: Any) -> AttentionLayout:
        """The layout of ``text_config``; raises ``ValueError`` for masks a tree cannot mirror."""
        if getattr(text_config, "use_bidirectional_attention", False) or not getattr(
            text_config, "is_causal", True
        ):
            raise ValueError("the model uses bidirectional attention; greedy decoding needs a causal model")
        # Only a declared field counts: Llama's config keeps a stray ``sliding_window`` key from a
        # config file as an attribute, but its modeling code never builds a window.
        window = (
            getattr(text_config, "sliding_window", None) if _declares(text_config, "sliding_window") else None
        )
        layer_types = getattr(text_config, "layer_types", None)
        if not layer_types:
            return cls(int(window) if window else None, None)
        kinds = frozenset(layer_types)
        if not kinds <= {"full_attention", "sliding_attention"}:
            unknown = ", ".join(sorted(kinds - {"full_attention", "sliding_attention"}))
            raise ValueError(f"unsupported attention layer type(s): {unknown}")
        if "sliding_attention" in kinds and not window:
            raise ValueError("the config has sliding-attention layers but no sliding_window")
        return cls(int(window) if "sliding_attention" in kinds else None, kinds)


def _declares(config: Any, name: str) -> bool:
    """Whether ``config``'s class declares the setting ``name`` (not just holds it from a file)."""
    if dataclasses.is_dataclass(config):
        return name in {field.name for field in dataclasses.fields(config)}
    return hasattr(type(config), name)


#: The config attributes that name image or video placeholder tokens (never part of a drafting key).
PLACEHOLDER_ATTRIBUTES = (
    "image_token_id",
    "image_token_index",
    "video_token_id",
    "vision_start_token_id",
    "vision_end_token_id",
)


def placeholder_ids(config: Any) -> frozenset[int]:
    """The image and video placeholder ids a model's config names (the ids its tokenizer spells as
    image tokens are the adapter's to add)."""
    values = (getattr(config, name, None) for name in PLACEHOLDER_ATTRIBUTES)
    return frozenset(value for value in values if isinstance(value, int))
