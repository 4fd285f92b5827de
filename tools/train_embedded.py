"""Train and evaluate the embedded default model: a tiny LLaVA that reads synthetic shape scenes.

Usage::

    python -m tools.train_embedded --out assets/models/tiny-scenes-llava --steps 1800 --seed 0
    python -m tools.train_embedded --eval assets/models/tiny-scenes-llava --n-per-type 50

The shipped folder is a plain ``LlavaForConditionalGeneration`` (CLIP vision tower + Llama text model)
with a byte-level BPE tokenizer, a ``LlavaProcessor`` and a generation config; it loads offline with
``AutoProcessor`` / ``AutoModelForImageTextToText``. Training adds a head that exists only during
training: from each projected image token it predicts the colour, kind, size and grid cell of the shape
under that patch, which makes the image tokens carry what the answers need.

Training is step-driven and seeded (scene seeds come from ``numpy.random.default_rng(seed)`` and lie in
``[0, scenes.HELDOUT_SEED_START)``); the loss covers answer tokens (and their eos) only. Several
questions about one image are packed into one multi-turn sequence; the first turn is a plain single-turn
prompt, exactly what inference sees.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from tqdm import tqdm

from recap import scenes
from tools.bpe import train_byte_level_bpe

logger = logging.getLogger(__name__)

PAD, BOS, EOS, IMAGE = "<pad>", "<s>", "</s>", "<image>"
SPECIAL_TOKENS = (PAD, BOS, EOS, IMAGE)  # ids 0..3, in this order
VOCAB_SIZE = 512
PATCH_SIZE = 8
NUM_IMAGE_TOKENS = (scenes.IMAGE_SIZE // PATCH_SIZE) ** 2
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

# One line; turns are "USER: <image>\n{question}\n" and "ASSISTANT: {answer}</s>\n".
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ 'USER: ' }}{% else %}{{ 'ASSISTANT: ' }}{% endif %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}{{ '<image>\n' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '\n' }}{% else %}{{ eos_token + '\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)

# How often each question type is asked during training (colour is the hardest, so it is asked most).
QTYPE_WEIGHTS = {"describe": 0.2, "colour": 0.35, "count": 0.15, "position": 0.3}
MAX_TURNS = 3
# Which answer tokens the binding loss supervises: "asked" = every token of a colour/position answer
# attends to the asked shape; "mentions" = that, plus each shape phrase of describe/count answers
# ("a small red circle in the top left", "a red circle") attends to the shape it names.
ATTN_SCOPES = ("asked", "mentions")


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of one training run (all step counts, no wall-clock)."""

    steps: int = 1800
    batch: int = 32
    lr: float = 2e-3
    warmup: int = 100
    min_lr_ratio: float = 0.05
    weight_decay: float = 0.01
    aux_weight: float = 0.5
    attn_weight: float = 0.0
    attn_layers: tuple[int, ...] = (1, 2)
    attn_scope: str = "asked"  # see ATTN_SCOPES
    seed: int = 0
    threads: int = 1
    bf16: bool = True


# --------------------------------------------------------------------------------------------------
# Tokenizer and model


def tokenizer_corpus(n_scenes: int = 3000, seed: int = 12345) -> list[str]:
    """Text to train the BPE on: chat-formatted question/answer turns about random training scenes."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(n_scenes):
        scene = scenes.sample_scene(rng)
        for qtype in scenes.QUESTION_TYPES:
            q, a = scenes.make_question(scene, qtype, rng)
            lines.append(f"USER: {q}\nASSISTANT: {a}\n")
    return lines


def build_tokenizer(vocab_size: int = VOCAB_SIZE):
    """A byte-level BPE ``PreTrainedTokenizerFast`` (any text tokenizes) with the chat template."""
    from transformers import PreTrainedTokenizerFast

    tok = train_byte_level_bpe(tokenizer_corpus(), vocab_size, SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        extra_special_tokens={"image_token": IMAGE},
        padding_side="left",
        model_max_length=1024,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    for i, t in enumerate(SPECIAL_TOKENS):
        assert fast.convert_tokens_to_ids(t) == i, (t, fast.convert_tokens_to_ids(t))
    return fast


def build_processor(tokenizer):
    """A ``LlavaProcessor`` with the PIL CLIP image processor at 64x64 (no crop)."""
    from transformers import LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    image_processor = CLIPImageProcessorPil(
        size={"height": scenes.IMAGE_SIZE, "width": scenes.IMAGE_SIZE},
        do_center_crop=False,
        crop_size={"height": scenes.IMAGE_SIZE, "width": scenes.IMAGE_SIZE},
    )
    return LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default",
        chat_template=CHAT_TEMPLATE,
        num_additional_image_tokens=1,  # CLIP's CLS token, dropped by the "default" strategy
    )


def build_model(vocab_size: int, seed: int):
    """A randomly initialised tiny ``LlavaForConditionalGeneration`` (~2.4M parameters)."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    vision = CLIPVisionConfig(
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=scenes.IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        projection_dim=128,
    )
    text = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=192,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=SPECIAL_TOKENS.index(IMAGE),
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
        projector_hidden_act="gelu",
        image_seq_length=NUM_IMAGE_TOKENS,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config)
    model.generation_config.update(
        bos_token_id=1, eos_token_id=2, pad_token_id=0, do_sample=False, max_new_tokens=64
    )
    return model


class PatchHead(nn.Module):
    """Training-only head: per image token, logits for colour, kind, size and cell of the shape below."""

    def __init__(self, dim: int):
        super().__init__()
        self.sizes = {
            "colour": len(scenes.COLOURS) + 1,
            "kind": len(scenes.KINDS) + 1,
            "size": len(scenes.SIZES) + 1,
            "cell": len(scenes.POSITIONS) + 1,
        }
        self.heads = nn.ModuleDict({k: nn.Linear(dim, n) for k, n in self.sizes.items()})

    def loss(self, features: torch.Tensor, targets: dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean cross-entropy over heads; features (N, P, D), targets (N, P) ints, 0 = background."""
        losses = [
            F.cross_entropy(self.heads[k](features).flatten(0, 1).float(), targets[k].flatten())
            for k in self.heads
        ]
        return sum(losses) / len(losses)


# --------------------------------------------------------------------------------------------------
# Data


def pixel_values(images: list) -> torch.Tensor:
    """(N, 3, 64, 64) float tensor, normalised like the CLIP image processor."""
    arr = np.stack([np.asarray(im, dtype=np.float32) for im in images]) / 255.0
    arr = (arr - np.array(CLIP_MEAN, dtype=np.float32)) / np.array(CLIP_STD, dtype=np.float32)
    return torch.from_numpy(arr.transpose(0, 3, 1, 2).copy())


def patch_targets(scene: scenes.Scene, min_pixels: int = 6) -> dict[str, np.ndarray]:
    """Per-patch class ids (row-major, 64 patches): the dominant shape's attributes, 0 for background;
    ``shape`` is the dominant shape's index + 1."""
    index = scenes.shape_index_map(scene)
    p = PATCH_SIZE
    g = scenes.IMAGE_SIZE // p
    blocks = index.reshape(g, p, g, p).transpose(0, 2, 1, 3).reshape(g * g, p * p)
    counts = np.stack([(blocks == i + 1).sum(1) for i in range(scene.count)], axis=1)
    dominant = np.where(counts.max(1) >= min_pixels, counts.argmax(1) + 1, 0)
    colour_ids = [0] + [list(scenes.COLOURS).index(s.colour) + 1 for s in scene.shapes]
    kind_ids = [0] + [scenes.KINDS.index(s.kind) + 1 for s in scene.shapes]
    size_ids = [0] + [scenes.SIZES.index(s.size) + 1 for s in scene.shapes]
    cell_ids = [0] + [s.cell + 1 for s in scene.shapes]
    return {
        "shape": dominant,
        **{
            name: np.asarray(ids)[dominant]
            for name, ids in (
                ("colour", colour_ids),
                ("kind", kind_ids),
                ("size", size_ids),
                ("cell", cell_ids),
            )
        },
    }


class SequenceBuilder:
    """Turns (question, answer) turns into token ids and labels that match the chat template exactly."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.cache: dict[str, list[int]] = {}
        self.offsets_cache: dict[str, tuple[list[int], list[tuple[int, int]]]] = {}
        self.bos, self.eos, self.image = (tokenizer.convert_tokens_to_ids(t) for t in (BOS, EOS, IMAGE))

    def encode(self, text: str) -> list[int]:
        if text not in self.cache:
            self.cache[text] = self.tok.encode(text, add_special_tokens=False)
        return self.cache[text]

    def build(
        self, turns: list[tuple[str, str]], spans: list[list[tuple[int, int, int]]] | None = None
    ) -> tuple[list[int], list[int], list[int]]:
        """ids, labels (-100 outside answers) for ``<s>USER: <image>\\nQ\\nASSISTANT: A</s>\\n...``, and
        ``focus``: per position, the shape id (index + 1) the binding loss wants it to attend to, else 0.

        ``spans[i]`` lists ``(start, end, shape_id)`` character spans of answer ``i`` (the eos counts as
        one character after the answer); a position gets ``shape_id`` when the token it predicts overlaps
        the span."""
        ids = [self.bos] + self.encode("USER: ") + [self.image] * NUM_IMAGE_TOKENS
        labels = [-100] * len(ids)
        focus = [0] * len(ids)
        for i, (question, answer) in enumerate(turns):
            prompt = ("\n" if i == 0 else "USER: ") + question + "\nASSISTANT:"
            # After the first turn a "\n" follows the previous eos (tokenized apart: eos is special).
            prompt_ids = (self.encode("\n") if i > 0 else []) + self.encode(prompt)
            answer_ids, offsets = self.encode_with_offsets(" " + answer)
            answer_ids = [*answer_ids, self.eos]
            offsets = [(a - 1, b - 1) for a, b in offsets] + [(len(answer), len(answer) + 1)]
            # Position t predicts token t + 1: the last prompt token predicts the first answer token.
            predicted = [0] * len(answer_ids)
            for start, end, shape_id in spans[i] if spans else []:
                for j, (a, b) in enumerate(offsets):
                    if a < end and b > start:
                        predicted[j] = shape_id
            focus += [0] * (len(prompt_ids) - 1) + predicted + [0]
            ids += prompt_ids + answer_ids
            labels += [-100] * len(prompt_ids) + answer_ids
        return ids, labels, focus

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of ``text`` and each token's character span."""
        if text not in self.offsets_cache:
            enc = self.tok(text, add_special_tokens=False, return_offsets_mapping=True)
            self.offsets_cache[text] = (enc["input_ids"], [tuple(o) for o in enc["offset_mapping"]])
        return self.offsets_cache[text]

    @property
    def image_offset(self) -> int:
        """Index of the first image token in every built sequence."""
        return 1 + len(self.encode("USER: "))


def training_scene_seed(rng: np.random.Generator) -> int:
    """A training scene seed, always below ``scenes.HELDOUT_SEED_START`` (disjoint from held-out seeds)."""
    return int(rng.integers(scenes.HELDOUT_SEED_START))


def binding_spans(scene: scenes.Scene, qtype: str, question: str, answer: str, scope: str):
    """Character spans ``(start, end, shape_id)`` of ``answer`` that the binding loss supervises."""
    if scope not in ATTN_SCOPES:
        raise ValueError(f"attn_scope must be one of {ATTN_SCOPES}, not {scope!r}")
    kinds = [s.kind for s in scene.shapes]
    if qtype in ("colour", "position"):  # the whole answer (and its eos) is about the asked shape
        return [(0, len(answer) + 1, kinds.index(scenes.question_target(question)) + 1)]
    if scope == "asked":
        return []
    spans = []
    for shape_id, s in enumerate(scene.shapes, start=1):
        if qtype == "describe":
            phrase = f"a {s.size} {s.colour} {s.kind} in the {s.position}"
        else:
            phrase = f"a {s.colour} {s.kind}"
        start = answer.find(phrase)
        if start >= 0:
            spans.append((start, start + len(phrase), shape_id))
    return spans


def sample_batch(
    rng: np.random.Generator, builder: SequenceBuilder, batch: int, attn_scope: str = "asked"
) -> dict[str, torch.Tensor]:
    """A batch of packed sequences about ``batch`` fresh training scenes, with patch targets.

    ``attn_target[n, t, p]`` is True where position ``t`` predicts an answer token about one shape
    (see ``binding_spans``) and image patch ``p`` shows that shape (what a binding head should attend to)."""
    qtypes, weights = list(QTYPE_WEIGHTS), np.array(list(QTYPE_WEIGHTS.values()))
    images, seqs, targets = [], [], []
    for _ in range(batch):
        scene_rng = np.random.default_rng(training_scene_seed(rng))
        scene = scenes.sample_scene(scene_rng)
        n_turns = int(scene_rng.integers(1, MAX_TURNS + 1))
        picked = scene_rng.choice(len(qtypes), size=n_turns, replace=False, p=weights)
        turns = [scenes.make_question(scene, qtypes[k], scene_rng) for k in picked]
        spans = [
            binding_spans(scene, qtypes[k], q, a, attn_scope) for k, (q, a) in zip(picked, turns, strict=True)
        ]
        images.append(scenes.render_scene(scene))
        seqs.append(builder.build(turns, spans))
        targets.append(patch_targets(scene))
    length = max(len(ids) for ids, _, _ in seqs)
    input_ids = torch.zeros(batch, length, dtype=torch.long)
    labels = torch.full((batch, length), -100, dtype=torch.long)
    mask = torch.zeros(batch, length, dtype=torch.long)
    attn_target = torch.zeros(batch, length, NUM_IMAGE_TOKENS, dtype=torch.bool)
    for i, (ids, lab, focus) in enumerate(seqs):  # right padding: training needs no left alignment
        input_ids[i, : len(ids)] = torch.tensor(ids)
        labels[i, : len(lab)] = torch.tensor(lab)
        mask[i, : len(ids)] = 1
        for t, shape_id in enumerate(focus):
            if shape_id:
                attn_target[i, t] = torch.from_numpy(targets[i]["shape"] == shape_id)
    aux = {k: torch.from_numpy(np.stack([t[k] for t in targets])).long() for k in targets[0] if k != "shape"}
    return {
        "input_ids": input_ids,
        "labels": labels,
        "attention_mask": mask,
        "pixel_values": pixel_values(images),
        "aux": aux,
        "attn_target": attn_target,
    }


# --------------------------------------------------------------------------------------------------
# Training


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup then cosine decay to ``min_lr_ratio * lr``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def attention_loss(
    attentions: tuple[torch.Tensor, ...], layers: tuple[int, ...], target: torch.Tensor, offset: int
):
    """Binding loss: ``-log`` of the attention mass head 0 of each of ``layers`` puts on the asked shape's
    patches, averaged over the positions that have a target (``target``: (N, L, 64) bool)."""
    rows = target.any(-1)
    if not rows.any():
        return attentions[0].new_zeros(()).float()
    tgt = target[rows].float()
    losses = []
    for layer in layers:
        weights = attentions[layer][:, 0, :, offset : offset + NUM_IMAGE_TOKENS].float()  # (N, L, 64)
        mass = (weights[rows] * tgt).sum(-1)
        losses.append(-torch.log(mass + 1e-6).mean())
    return sum(losses) / len(losses)


def train_step(model, head: PatchHead, batch: dict, cfg: TrainConfig, image_offset: int):
    """Forward one batch; returns (answer-token LM loss, auxiliary patch loss, attention binding loss)."""
    captured: list[torch.Tensor] = []
    # The projector output is exactly what the language model receives as image tokens: (N, 64, D).
    hook = model.model.multi_modal_projector.register_forward_hook(lambda _m, _i, out: captured.append(out))
    supervise_attention = cfg.attn_weight > 0
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
            out = model(
                input_ids=batch["input_ids"],
                pixel_values=batch["pixel_values"],
                attention_mask=batch["attention_mask"],
                output_attentions=supervise_attention,
            )
            logits = out.logits[:, :-1].float()
            labels = batch["labels"][:, 1:].flatten()
            lm_loss = F.cross_entropy(logits.flatten(0, 1), labels, ignore_index=-100)
            aux_loss = head.loss(captured[0], batch["aux"])
            if supervise_attention:
                attn_loss = attention_loss(
                    out.attentions, cfg.attn_layers, batch["attn_target"], image_offset
                )
            else:
                attn_loss = lm_loss.new_zeros(())
    finally:
        hook.remove()
    return lm_loss, aux_loss, attn_loss


def train(out_dir: Path, cfg: TrainConfig) -> None:
    """Train from scratch for ``cfg.steps`` steps and save model, processor and tokenizer in ``out_dir``."""
    torch.set_num_threads(cfg.threads)
    tokenizer = build_tokenizer()
    processor = build_processor(tokenizer)
    model = build_model(len(tokenizer), cfg.seed)
    head = PatchHead(model.config.text_config.hidden_size)
    n_params = sum(p.numel() for p in model.parameters())
    logger.info("model: %.2fM parameters, vocab %d, %s", n_params / 1e6, len(tokenizer), cfg)
    params = list(model.parameters()) + list(head.parameters())
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
    )
    if cfg.attn_weight > 0:
        model.set_attn_implementation("eager")  # attention weights are only returned by eager attention
    rng = np.random.default_rng(cfg.seed)
    builder = SequenceBuilder(tokenizer)
    model.train()
    bar = tqdm(range(cfg.steps), desc="train", mininterval=5)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg)
        batch = sample_batch(rng, builder, cfg.batch, cfg.attn_scope)
        lm_loss, aux_loss, attn_loss = train_step(model, head, batch, cfg, builder.image_offset)
        optimizer.zero_grad(set_to_none=True)
        (lm_loss + cfg.aux_weight * aux_loss + cfg.attn_weight * attn_loss).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        losses = {"lm": lm_loss.item(), "aux": aux_loss.item(), "attn": attn_loss.item()}
        bar.set_postfix({k: f"{v:.3f}" for k, v in losses.items()}, refresh=False)
        if step % 100 == 0 or step == cfg.steps - 1:
            logger.info(
                "step %d %s lr %.2e",
                step,
                " ".join(f"{k} {v:.4f}" for k, v in losses.items()),
                lr_at(step, cfg),
            )
    model.set_attn_implementation("sdpa")
    save(model.eval(), processor, out_dir)


def save(model, processor, out_dir: Path) -> None:
    """Write config, fp32 safetensors, generation config, tokenizer and processor files."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    processor.save_pretrained(out_dir)
    logger.info("saved to %s (%.2f MB)", out_dir, folder_size(out_dir) / 1e6)


# --------------------------------------------------------------------------------------------------
# Evaluation


def folder_size(path: Path) -> int:
    """Total bytes of the files under ``path``."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def load(model_dir: Path):
    """(processor, model) loaded offline from ``model_dir``."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    return processor, model


def prompt_text(processor, question: str) -> str:
    """The single-turn chat prompt for one image and ``question``."""
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    return processor.apply_chat_template(messages, add_generation_prompt=True)


@torch.inference_mode()
def generate_answers(
    processor, model, images: list, questions: list[str], max_new_tokens: int = 60, batch_size: int = 50
) -> list[str]:
    """Greedy answers (decoded, special tokens skipped), batched with left padding."""
    answers = []
    for start in range(0, len(images), batch_size):
        texts = [prompt_text(processor, q) for q in questions[start : start + batch_size]]
        inputs = processor(
            images=images[start : start + batch_size], text=texts, return_tensors="pt", padding=True
        )
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        new = out[:, inputs["input_ids"].shape[1] :]
        answers += processor.batch_decode(new, skip_special_tokens=True)
    return answers


def accuracy_by_type(
    processor, model, items: list[dict], shuffle_images: bool = False, max_new_tokens: int = 60
) -> dict[str, float]:
    """Fraction of correct canonical facts per question type; with ``shuffle_images`` each question gets
    the image of the next item of the same type (another scene)."""
    images = [it["image"] for it in items]
    if shuffle_images:
        by_type: dict[str, list[int]] = {}
        for i, it in enumerate(items):
            by_type.setdefault(it["qtype"], []).append(i)
        for idx in by_type.values():
            for a, b in zip(idx, idx[1:] + idx[:1], strict=True):
                images[a] = items[b]["image"]
    answers = generate_answers(processor, model, images, [it["prompt"] for it in items], max_new_tokens)
    result: dict[str, list[bool]] = {}
    for it, ans in zip(items, answers, strict=True):
        ok = scenes.answer_is_correct(it["qtype"], it["scene"], ans, it["prompt"])
        result.setdefault(it["qtype"], []).append(ok)
    return {k: float(np.mean(v)) for k, v in result.items()}


@torch.inference_mode()
def tokens_per_second(
    processor, model, image, question: str = "Describe the image.", max_new_tokens: int = 60, repeats: int = 3
) -> float:
    """Greedy single-sequence generation speed (new tokens / s) on the current thread setting."""
    inputs = processor(images=image, text=prompt_text(processor, question), return_tensors="pt")
    model.generate(**inputs, max_new_tokens=4, do_sample=False)  # warm-up
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        n = out.shape[1] - inputs["input_ids"].shape[1]
        best = max(best, n / (time.perf_counter() - t0))
    return best


def evaluate(model_dir: Path, n_per_type: int = 50, seed: int = 0) -> dict:
    """Held-out accuracy (real and shuffled images), tokens/s on one thread and folder size."""
    torch.set_num_threads(1)
    processor, model = load(model_dir)
    items = scenes.heldout_set(seed=seed, n_per_type=n_per_type)
    return {
        "real": accuracy_by_type(processor, model, items),
        "shuffled": accuracy_by_type(processor, model, items, shuffle_images=True),
        "tokens_per_s_1_thread": tokens_per_second(processor, model, items[0]["image"]),
        "folder_mb": folder_size(model_dir) / 1e6,
        "n_per_type": n_per_type,
        "heldout_seed": seed,
    }


def write_examples(out_dir: Path, n: int = 6, seed: int = 7) -> list[dict]:
    """Save ``n`` held-out scenes as ``scene_<i>.png`` plus ``prompts.json`` ([{"image", "prompt"}])."""
    out_dir.mkdir(parents=True, exist_ok=True)
    n_types = len(scenes.QUESTION_TYPES)
    per_type = math.ceil(n / n_types)
    items = scenes.heldout_set(seed=seed, n_per_type=per_type)  # grouped by question type
    chosen = [items[t * per_type + j] for j in range(per_type) for t in range(n_types)][:n]  # alternate types
    prompts = []
    for i, it in enumerate(chosen, start=1):
        name = f"scene_{i}.png"
        it["image"].save(out_dir / name)
        prompts.append({"image": name, "prompt": it["prompt"], "qtype": it["qtype"], "seed": it["seed"]})
    (out_dir / "prompts.json").write_text(json.dumps(prompts, indent=2) + "\n")
    return prompts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="train and save the model here")
    parser.add_argument("--eval", type=Path, help="evaluate the model saved here")
    parser.add_argument("--steps", type=int, default=TrainConfig.steps)
    parser.add_argument("--seed", type=int, default=TrainConfig.seed)
    parser.add_argument("--batch", type=int, default=TrainConfig.batch)
    parser.add_argument("--lr", type=float, default=TrainConfig.lr)
    parser.add_argument("--threads", type=int, default=TrainConfig.threads)
    parser.add_argument(
        "--aux-weight",
        type=float,
        default=TrainConfig.aux_weight,
        help="weight of the per-patch colour/kind/size/cell loss",
    )
    parser.add_argument(
        "--attn-weight",
        type=float,
        default=TrainConfig.attn_weight,
        help="weight of the binding loss on head 0 of layers 1-2 (0 = off)",
    )
    parser.add_argument(
        "--attn-scope",
        choices=ATTN_SCOPES,
        default=TrainConfig.attn_scope,
        help="answer tokens the binding loss supervises",
    )
    parser.add_argument("--n-per-type", type=int, default=50)
    parser.add_argument("--heldout-seed", type=int, default=0, help="which held-out set --eval uses")
    parser.add_argument("--examples", type=Path, help="write example scenes and prompts.json here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not (args.out or args.eval or args.examples):
        parser.error("give --out DIR (train), --eval DIR and/or --examples DIR")
    if args.examples:
        print(json.dumps(write_examples(args.examples), indent=2))
    if args.out:
        cfg = TrainConfig(
            steps=args.steps,
            batch=args.batch,
            lr=args.lr,
            seed=args.seed,
            threads=args.threads,
            aux_weight=args.aux_weight,
            attn_weight=args.attn_weight,
            attn_scope=args.attn_scope,
        )
        t0 = time.perf_counter()
        train(args.out, cfg)
        print(f"trained {cfg.steps} steps in {(time.perf_counter() - t0) / 60:.1f} min -> {args.out}")
    if args.eval:
        print(json.dumps(evaluate(args.eval, args.n_per_type, args.heldout_seed), indent=2))


if __name__ == "__main__":
    main()
