"""Random configurations of every supported family, drawn from fixed seeds (for the lossless suite).

``random_case(arch, seed)`` draws a `tiny_models.Draw` (layers, heads, kv heads, head_dim, rope
theta and scaling, sliding windows shorter than the context in each family's own style, vision
input sizes, LLaVA's text backbone and feature layer, Idefics3's pixel shuffle and tiling) and the
two requests to run on it (prompt lengths, how many images, of which odd sizes, how many tokens).
The same (arch, seed) always gives the same case, so a failure names its reproducer.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
from PIL import Image
from tiny_models import ARCHITECTURES, CORPUS, VISION_ARCHITECTURES, Draw

#: Every family the suite draws: the tiny-model table plus the other supported text families.
FAMILIES = (*ARCHITECTURES, "qwen3", "gemma", "smollm3")
WORDS = " ".join(CORPUS).split()


@dataclass
class Request:
    prompt: str
    images: list[Image.Image]
    max_new_tokens: int


@dataclass
class Case:
    arch: str
    seed: int
    draw: Draw
    requests: list[Request]

    def describe(self) -> str:
        """One line naming everything drawn (printed with a failure)."""
        sizes = [[image.size for image in r.images] for r in self.requests]
        return f"{self.arch} seed {self.seed}: {self.draw} images {sizes}"


def random_case(arch: str, seed: int) -> Case:
    rng = np.random.default_rng([zlib.crc32(arch.encode()), seed])
    draw = _draw(rng, arch)
    requests = [_request(rng, arch) for _ in range(2)]
    return Case(arch, seed, draw, requests)


def _pick(rng: np.random.Generator, options):
    return options[int(rng.integers(len(options)))]


def _text(rng: np.random.Generator, model_type: str, mrope: bool = False) -> dict:
    """Text-config settings of ``model_type``; windows (2 to 12 tokens) always shorter than a request."""
    heads = _pick(rng, [2, 4, 6])
    head_dim = _pick(rng, [8, 12, 16] if mrope else [4, 8, 12, 16])
    layers = int(rng.integers(1, 4))
    hidden = heads * head_dim
    theta = float(_pick(rng, [10.0, 100.0, 10_000.0, 1_000_000.0]))
    rope: dict = {"rope_type": "default", "rope_theta": theta}
    text = dict(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=_pick(rng, [d for d in (1, 2, 3, 6) if heads % d == 0]),
        initializer_range=float(_pick(rng, [0.02, 0.1, 0.2, 0.3])),
    )
    window = int(rng.integers(2, 13))
    sliding = rng.random() < 0.8
    mixed = [_pick(rng, ["sliding_attention", "full_attention"]) for _ in range(layers)]
    if model_type in ("llama", "mistral", "gemma", "gemma2", "gemma3_text", "qwen3", "smollm3"):
        text["head_dim"] = head_dim
    if mrope:  # the three sections (time, height, width) share the head_dim / 2 rotary pairs
        cuts = np.sort(rng.choice(np.arange(1, head_dim // 2), size=2, replace=False))
        rope["mrope_section"] = [int(cuts[0]), int(cuts[1] - cuts[0]), int(head_dim // 2 - cuts[1])]
    if model_type == "llama" and rng.random() < 0.4:
        rope.update(rope_type="linear", factor=float(_pick(rng, [2.0, 4.0])))
    if model_type in ("mistral", "phi3"):  # one window for every layer, or none
        text["sliding_window"] = window if sliding else None
    if model_type == "phi3":
        rope["partial_rotary_factor"] = float(_pick(rng, [0.5, 1.0]))
    if model_type in (
        "qwen2",
        "qwen3",
        "qwen2_vl_text",
        "qwen2_5_vl_text",
    ):  # layers from max_window_layers on
        text.update(use_sliding_window=sliding, sliding_window=window)
        text["max_window_layers"] = int(rng.integers(0, layers + 1))
    if model_type == "smollm3":  # windows only on the layers without rope
        text["no_rope_layers"] = [int(rng.integers(0, 2)) for _ in range(layers)]
        text.update(use_sliding_window=sliding, sliding_window=window)
    if model_type in ("gemma2", "gemma3_text"):  # per-layer types, any mix
        text.update(layer_types=mixed, sliding_window=window, query_pre_attn_scalar=head_dim)
    if model_type == "gemma2":
        text["attn_logit_softcapping"] = _pick(rng, [None, 50.0, 3.0])
        text["final_logit_softcapping"] = _pick(rng, [None, 30.0])
    if model_type == "gemma3_text":
        local = {"rope_type": "default", "rope_theta": float(_pick(rng, [10.0, 10_000.0]))}
        rope = {"sliding_attention": local, "full_attention": rope}
    text["rope_parameters"] = rope
    return text


def _draw(rng: np.random.Generator, arch: str) -> Draw:
    if arch in ("llava", "llava_next"):
        backbone = _pick(rng, ["llama", "mistral", "qwen2"])
        return Draw(
            text=_text(rng, backbone),
            backbone=backbone,
            image_size=_pick(rng, [16, 24, 32]),
            vision_layers=int(rng.integers(1, 3)),
            # LLaVA-NeXT's tile packing assumes the CLS feature dropped (transformers fails otherwise).
            feature_strategy=_pick(rng, ["default", "full"]) if arch == "llava" else "default",
            feature_layer=_pick(rng, [-1, -2]),
        )
    if arch in ("qwen2_vl", "qwen2_5_vl"):
        return Draw(
            text=_text(rng, f"{arch}_text", mrope=True),
            vision_layers=int(rng.integers(1, 3)),
            max_pixels=_pick(rng, [56 * 56, 84 * 140, 112 * 112, 168 * 168]),
        )
    if arch in ("idefics3", "smolvlm"):
        return Draw(
            text=_text(rng, "llama"),
            image_size=_pick(rng, [16, 32]),
            vision_layers=int(rng.integers(1, 3)),
            scale_factor=_pick(rng, [1, 2]),
            image_splitting=bool(rng.random() < 0.5),
        )
    return Draw(text=_text(rng, arch))


def _request(rng: np.random.Generator, arch: str) -> Request:
    """A prompt of 12 to 30 words (longer than any window), 16 to 40 new tokens, and for vision
    families 0 to 3 images of odd sizes (every vision family takes several per request)."""
    words = rng.choice(WORDS, size=int(rng.integers(12, 31)))
    count = int(_pick(rng, [0, 1, 1, 2, 2, 3])) if arch in VISION_ARCHITECTURES else 0
    images = [_noise(rng, int(rng.integers(5, 121)), int(rng.integers(5, 121))) for _ in range(count)]
    return Request(" ".join(words), images, int(rng.integers(16, 41)))


def _noise(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    return Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8))
