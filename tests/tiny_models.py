"""Tiny random-weight models of every supported architecture, built in-process (no network).

Each builder returns a `recap.models.TargetModel` over a real transformers class with a real
(tiny) processor, so tests exercise the same code paths as the hub models. One byte-level BPE
tokenizer, trained in milliseconds, serves every family; its special tokens cover all of them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from tokenizers import Tokenizer
from transformers import BatchFeature, PreTrainedTokenizerFast

from recap.models import TargetModel, supported_attention
from training.bpe import train_byte_level_bpe

SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<image>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<fake_token_around_image>",
    "<global-img>",
    "<end_of_utterance>",
]
CORPUS = [
    "the cat is black and the dog is white. a red circle is on the left of the image.",
    "describe the image. what colour is the square? there are two shapes in the picture.",
    "the quick brown fox jumps over the lazy dog, again and again and again.",
]
IMAGE_MARKUP = {
    "llava": "<image>",
    "qwen_vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "idefics3": "<image>",
    "text": "",
}
ARCHITECTURES = (
    "llama",
    "qwen2",
    "gemma3_text",
    "mistral",
    "phi3",
    "gemma2",
    "llava",
    "llava_next",
    "qwen2_vl",
    "qwen2_5_vl",
    "idefics3",
    "smolvlm",
)
VISION_ARCHITECTURES = ("llava", "llava_next", "qwen2_vl", "qwen2_5_vl", "idefics3", "smolvlm")


def chat_template(image_markup: str) -> str:
    return (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
        "{% if c['type'] == 'image' %}" + image_markup + "{% else %}{{ c['text'] }}{% endif %}"
        "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


@functools.cache
def _tokenizer_json() -> str:
    return train_byte_level_bpe(CORPUS * 5, 340, SPECIALS).to_str()


def make_tokenizer(family: str = "text") -> PreTrainedTokenizerFast:
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json()),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens={"image_token": "<image>"} if family in ("llava", "idefics3") else {},
    )
    tokenizer.chat_template = chat_template(IMAGE_MARKUP[family])
    return tokenizer


def _llama_text(vocab: int, **extra) -> dict:
    return dict(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        **extra,
    )


def _vision(draw: Draw) -> dict:
    """The tiny vision tower every VLM builder shares (ViT-style; Qwen's is built apart)."""
    return dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=draw.vision_layers,
        num_attention_heads=2,
        image_size=draw.image_size,
        patch_size=8,
    )


def _clip_vision(draw: Draw) -> dict:
    return dict(_vision(draw), projection_dim=32)


class TinyQwenVLProcessor:
    """What Qwen2(.5)-VL's processor does, for tests (the real one needs torchvision to be built).

    Expands each ``<|image_pad|>`` into one token per merged patch and returns ``mm_token_type_ids``.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerFast, image_processor) -> None:
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.pad_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False):
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=tokenize
        )

    def __call__(self, text, images=None, return_tensors="pt"):
        ids = self.tokenizer(text[0], add_special_tokens=False)["input_ids"]
        out = {}
        if images:
            vision = self.image_processor(images=images, return_tensors="pt")
            merge = self.image_processor.merge_size**2
            counts = iter((vision["image_grid_thw"].prod(-1) // merge).tolist())
            ids = [t for i in ids for t in ([i] * next(counts) if i == self.pad_id else [i])]
            out.update(pixel_values=vision["pixel_values"], image_grid_thw=vision["image_grid_thw"])
        input_ids = torch.tensor([ids])
        out.update(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            mm_token_type_ids=(input_ids == self.pad_id).int(),
        )
        return BatchFeature(out)


@dataclass
class Draw:
    """One configuration of a family, as overrides of the fixed tiny settings (``Draw()`` = those).

    ``text``: the text config's sizes, rope and windows (``None``: the family's fixed tiny settings);
    ``backbone``: the text model type inside LLaVA-style models; the rest shape the vision side:
    CLIP/SigLIP input size (patches of 8 pixels), encoder depth, LLaVA's feature layer and whether
    it keeps the CLS feature, Idefics3's pixel shuffle and tiling, Qwen-VL's pixel budget.
    """

    text: dict | None = None
    backbone: str = "llama"
    image_size: int = 32
    vision_layers: int = 1
    feature_strategy: str = "default"
    feature_layer: int = -1
    scale_factor: int = 2
    image_splitting: bool = False
    max_pixels: int = 112 * 112


def build(arch: str, attn: str = "sdpa", seed: int = 0, draw: Draw | None = None) -> TargetModel:
    """A tiny fp32 model of architecture ``arch`` (a key of `BUILDERS`) with its processor."""
    torch.manual_seed(seed)
    model, processor = BUILDERS[arch](attn, draw or Draw())
    name = f"tiny-{arch}" if draw is None else f"random-{arch}-{seed}"
    return TargetModel(model.eval(), processor, name=name)


#: Config extras per text family. Every sliding window is shorter than the tests' contexts, and each
#: family keeps its own way of declaring one: per-layer ``layer_types`` (Qwen2, Gemma3) or a bare
#: ``sliding_window`` for every layer (Mistral, Phi-3). Larger initial weights make attention peaked
#: enough that a wrong window changes the greedy tokens, not only the logits.
TEXT_EXTRAS: dict[str, dict] = {
    "qwen2": {"use_sliding_window": True, "sliding_window": 7, "max_window_layers": 1},
    "gemma3_text": {
        "sliding_window": 6,
        "layer_types": ["sliding_attention", "full_attention"],
        "head_dim": 8,
    },
    "gemma2": {"sliding_window": 6, "head_dim": 8},  # layer_types default to sliding, full, ...
    "mistral": {"sliding_window": 8, "initializer_range": 0.2},
    "phi3": {"sliding_window": 8, "initializer_range": 0.2},
}


def _text_config(vocab: int, model_type: str, draw: Draw) -> dict:
    """Text-config settings: the draw's, or the fixed tiny ones of ``model_type``."""
    if draw.text is not None:
        return {**_llama_text(vocab), **draw.text}
    return _llama_text(vocab, **TEXT_EXTRAS.get(model_type, {}))


def _text(model_type: str):
    def builder(attn: str, draw: Draw):
        from transformers import AutoConfig, AutoModelForCausalLM

        tokenizer = make_tokenizer("text")
        config = AutoConfig.for_model(
            model_type,
            **_text_config(len(tokenizer), model_type, draw),
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=None,
        )
        # The same choice as TargetModel.load: Gemma2 asked for sdpa runs eager.
        attn = supported_attention(AutoModelForCausalLM._model_mapping[type(config)], attn)
        return AutoModelForCausalLM.from_config(config, attn_implementation=attn), tokenizer

    return builder


def _backbone(tokenizer: PreTrainedTokenizerFast, draw: Draw) -> dict:
    """The text config inside a LLaVA-style or Idefics3 model."""
    return dict(
        model_type=draw.backbone,
        **_text_config(len(tokenizer), draw.backbone, draw),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )


def _clip_processor_args(draw: Draw) -> dict:
    edge = draw.image_size
    return dict(size={"shortest_edge": edge}, crop_size={"height": edge, "width": edge})


def _llava_parts(draw: Draw) -> tuple[dict, dict]:
    """What LLaVA and LLaVA-NeXT share: the config's and the processor's keyword arguments."""
    tokenizer = make_tokenizer("llava")
    config = dict(
        vision_config=dict(model_type="clip_vision_model", **_clip_vision(draw)),
        text_config=_backbone(tokenizer, draw),
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        vision_feature_select_strategy=draw.feature_strategy,
        vision_feature_layer=draw.feature_layer,
        eos_token_id=tokenizer.eos_token_id,
    )
    processor = dict(
        tokenizer=tokenizer,
        patch_size=8,
        vision_feature_select_strategy=draw.feature_strategy,
        chat_template=tokenizer.chat_template,
        num_additional_image_tokens=1,
    )
    return config, processor


def _llava(attn: str, draw: Draw):
    from transformers import LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    config_args, processor_args = _llava_parts(draw)
    config = LlavaConfig(**config_args)
    image_processor = CLIPImageProcessorPil(**_clip_processor_args(draw))
    processor = LlavaProcessor(image_processor=image_processor, **processor_args)
    return LlavaForConditionalGeneration._from_config(config, attn_implementation=attn), processor


def _llava_next(attn: str, draw: Draw):
    from transformers import LlavaNextConfig, LlavaNextForConditionalGeneration, LlavaNextProcessor
    from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil

    config_args, processor_args = _llava_parts(draw)
    edge = draw.image_size
    pinpoints = [[edge, edge], [edge, 2 * edge], [2 * edge, edge]]
    config = LlavaNextConfig(**config_args, image_grid_pinpoints=pinpoints)
    image_processor = LlavaNextImageProcessorPil(**_clip_processor_args(draw), image_grid_pinpoints=pinpoints)
    processor = LlavaNextProcessor(image_processor=image_processor, **processor_args)
    return LlavaNextForConditionalGeneration._from_config(config, attn_implementation=attn), processor


def _qwen_vl(model_type: str):
    def builder(attn: str, draw: Draw):
        from transformers import AutoConfig, AutoModelForImageTextToText
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        tokenizer = make_tokenizer("qwen_vl")
        ids = tokenizer.convert_tokens_to_ids
        mrope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]}
        text = dict(
            model_type=model_type.replace("_vl", "_vl_text"),
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=None,
            **{**_llama_text(len(tokenizer), rope_parameters=mrope), **(draw.text or {})},
        )
        hidden = text["hidden_size"]  # the vision merger projects onto the text width
        vision = dict(
            depth=draw.vision_layers,
            hidden_size=hidden if model_type == "qwen2_vl" else 32,
            num_heads=2,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            in_channels=3,
        )
        if model_type == "qwen2_5_vl":
            vision.update(
                intermediate_size=64, out_hidden_size=hidden, fullatt_block_indexes=[0], window_size=56
            )
        else:
            vision.update(embed_dim=32, mlp_ratio=2)
        config = AutoConfig.for_model(
            model_type,
            text_config=text,
            vision_config=vision,
            image_token_id=ids("<|image_pad|>"),
            video_token_id=ids("<|video_pad|>"),
            vision_start_token_id=ids("<|vision_start|>"),
            vision_end_token_id=ids("<|vision_end|>"),
            eos_token_id=tokenizer.eos_token_id,
        )
        image_processor = Qwen2VLImageProcessorPil(
            min_pixels=56 * 56, max_pixels=draw.max_pixels, patch_size=14, merge_size=2, temporal_patch_size=2
        )
        model = AutoModelForImageTextToText.from_config(config, attn_implementation=attn)
        return model, TinyQwenVLProcessor(tokenizer, image_processor)

    return builder


def _idefics3(model_type: str):
    def builder(attn: str, draw: Draw):
        from transformers import AutoConfig, AutoModelForImageTextToText, Idefics3Processor
        from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

        tokenizer = make_tokenizer("idefics3")
        config = AutoConfig.for_model(
            model_type,
            vision_config=_vision(draw),
            text_config=_backbone(tokenizer, draw),
            image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
            scale_factor=draw.scale_factor,
            eos_token_id=tokenizer.eos_token_id,
        )
        edge = draw.image_size
        image_processor = Idefics3ImageProcessorPil(
            do_image_splitting=draw.image_splitting,
            size={"longest_edge": 2 * edge if draw.image_splitting else edge},
            max_image_size={"longest_edge": edge},
        )
        # SmolVLM's own processor needs num2words and a torchvision video processor; Idefics3's lays the
        # prompt out with the same image tokens per tile, which is what the model counts.
        processor = Idefics3Processor(
            image_processor=image_processor,
            tokenizer=tokenizer,
            image_seq_len=(draw.image_size // 8 // draw.scale_factor) ** 2,
            chat_template=tokenizer.chat_template,
        )
        return AutoModelForImageTextToText.from_config(config, attn_implementation=attn), processor

    return builder


#: arch -> builder(attn, draw) -> (model, processor). Beyond `ARCHITECTURES`, the other supported text
#: families, which the random-configuration suite draws.
BUILDERS = {
    "llama": _text("llama"),
    "qwen3": _text("qwen3"),
    "gemma": _text("gemma"),
    "smollm3": _text("smollm3"),
    "qwen2": _text("qwen2"),
    "gemma3_text": _text("gemma3_text"),
    "mistral": _text("mistral"),
    "phi3": _text("phi3"),
    "gemma2": _text("gemma2"),
    "llava": _llava,
    "llava_next": _llava_next,
    "qwen2_vl": _qwen_vl("qwen2_vl"),
    "qwen2_5_vl": _qwen_vl("qwen2_5_vl"),
    "idefics3": _idefics3("idefics3"),
    "smolvlm": _idefics3("smolvlm"),
}


# ------------------------------------------------------------------------------- SmolVLM's twin
#: The hub model the studio offers on a CPU, and what its twin keeps of it.
SMOLVLM_ID = "HuggingFaceTB/SmolVLM-256M-Instruct"
#: SmolVLM-256M-Instruct's chat template as published (roles capitalised, ``Assistant:`` to answer).
SMOLVLM_CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
#: The published configuration's values the twin keeps (architecture, image layout, rope), and the
#: sizes it shrinks: text hidden 576 / 30 layers / 9 heads (3 KV) -> 48 / 2 / 6 (2 KV); vision hidden
#: 768 / 12 layers, 512-pixel tiles -> 32 / 1, 128-pixel tiles (patches of 16 and the 4x pixel shuffle
#: kept, so a tile is 4 image tokens instead of 64).
SMOLVLM_TWIN = {
    "tile": 128,
    "patch": 16,
    "scale_factor": 4,
    "text": dict(
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=8,
        rms_norm_eps=1e-5,
        max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
        tie_word_embeddings=False,
    ),
}


def _smolvlm_tokenizer() -> PreTrainedTokenizerFast:
    """The byte-level BPE with SmolVLM's special tokens: ``<|im_start|>`` begins, ``<end_of_utterance>``
    ends a turn (the eos), ``<|im_end|>`` pads; the tile markers ``<row_r_col_c>`` are single tokens."""
    tiles = [f"<row_{r}_col_{c}>" for r in range(1, 5) for c in range(1, 5)]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<end_of_utterance>", "<image>",
                "<fake_token_around_image>", "<global-img>", *tiles]  # fmt: skip
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=train_byte_level_bpe(CORPUS * 5, 340, specials),
        bos_token="<|im_start|>",
        eos_token="<end_of_utterance>",
        pad_token="<|im_end|>",
        extra_special_tokens={
            "image_token": "<image>",
            "fake_image_token": "<fake_token_around_image>",
            "global_image_token": "<global-img>",
        },
    )
    tokenizer.chat_template = SMOLVLM_CHAT_TEMPLATE
    return tokenizer


def save_smolvlm_twin(folder, seed: int = 0):
    """Save a tiny random twin of SmolVLM-256M-Instruct to ``folder``, laid out as its hub repository is:
    ``config.json`` (``Idefics3ForConditionalGeneration``), the weights, the tokenizer, the image
    processor (``Idefics3ImageProcessor``: images resized to 4 tiles on their longest edge, then split
    into tiles) and the processor (``Idefics3Processor``, its ``image_seq_len``, the chat template).

    Returns:
        The folder, for ``Runtime.load`` (the path a hub id resolves to once downloaded).
    """
    from pathlib import Path

    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    folder = Path(folder)
    torch.manual_seed(seed)
    tokenizer = _smolvlm_tokenizer()
    tile, patch, scale = SMOLVLM_TWIN["tile"], SMOLVLM_TWIN["patch"], SMOLVLM_TWIN["scale_factor"]
    ids = tokenizer.convert_tokens_to_ids
    config = Idefics3Config(
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=tile,
            patch_size=patch,
            layer_norm_eps=1e-6,
        ),
        text_config=dict(
            model_type="llama",
            vocab_size=len(tokenizer),
            bos_token_id=ids("<|im_start|>"),
            eos_token_id=ids("<end_of_utterance>"),
            pad_token_id=ids("<|im_end|>"),
            **SMOLVLM_TWIN["text"],
        ),
        image_token_id=ids("<image>"),
        scale_factor=scale,
        tie_word_embeddings=False,
        pad_token_id=ids("<|im_end|>"),
    )
    model = Idefics3ForConditionalGeneration(config).eval()
    image_processor = Idefics3ImageProcessorPil(
        do_image_splitting=True,
        size={"longest_edge": 4 * tile},
        max_image_size={"longest_edge": tile},
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    processor = Idefics3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_len=(tile // patch // scale) ** 2,
        chat_template=SMOLVLM_CHAT_TEMPLATE,
    )
    model.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)
    processor.save_pretrained(folder)
    _hub_layout(folder)
    return folder


def _hub_layout(folder) -> None:
    """Rewrite the processor's files as the hub repository has them: ``preprocessor_config.json`` (the
    image processor, named without a backend: torchvision's where installed, else PIL's),
    ``processor_config.json`` (``image_seq_len``) and ``chat_template.json``."""
    import json

    nested = json.loads((folder / "processor_config.json").read_text(encoding="utf-8"))
    image = {**nested.pop("image_processor"), "image_processor_type": "Idefics3ImageProcessor"}
    image["processor_class"] = nested["processor_class"]
    files = {
        "preprocessor_config.json": image,
        "processor_config.json": {k: v for k, v in nested.items() if k != "chat_template"},
        "chat_template.json": {"chat_template": (folder / "chat_template.jinja").read_text(encoding="utf-8")},
    }
    for name, values in files.items():
        (folder / name).write_text(json.dumps(values, indent=2), encoding="utf-8")
    (folder / "chat_template.jinja").unlink()
