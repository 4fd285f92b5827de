"""Training data of the embedded model: the scene world, tokenizer, processor, packed sequences, batches.

Two worlds exist: ``v1`` (`recap.embedded.scenes`: 64x64 images, 6 colours, 4 kinds; the shipped model) and
``v2``
(`recap.embedded.scenes2`: 96x96, 12 colours, 8 kinds, relations and detailed descriptions). A `World`
names the
scene module and the geometry the model needs (image size, patch size, vocabulary, question mix).

A batch is a pure function of its scene seeds (`batch_from_seeds`), and the seeds come from one
sequential ``numpy`` generator in the training process (`draw_seeds`). So `training.batch_stream.BatchStream`
may build batches in worker processes (``workers > 0``, for a GPU that would otherwise wait on PIL and
the tokenizer) and training stays bit-identical to building them in the main process.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import ModuleType

import numpy as np
import torch

from recap.embedded import scenes, scenes2
from training.bpe import train_byte_level_bpe
from training.phrasing_families import add_noise, ask_in_family

PAD, BOS, EOS, IMAGE = "<pad>", "<s>", "</s>", "<image>"
SPECIAL_TOKENS = (PAD, BOS, EOS, IMAGE)  # ids 0..3, in this order
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
MAX_TURNS = 3
# Which answer tokens the binding loss supervises: "asked" = every token of a colour/position answer
# attends to the asked shape; "mentions" = that, plus each phrase about one shape in other answers.
ATTN_SCOPES = ("asked", "mentions")

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


@dataclass(frozen=True)
class World:
    """A scene generator the model learns, and the model geometry it implies."""

    name: str
    scenes: ModuleType
    patch_size: int
    vocab_size: int
    #: How often each question type is asked in training.
    qtype_weights: dict[str, float] = field(default_factory=dict)
    #: Extra training phrasings per question type (v2 only): groups of phrasings, a draw picks a group
    #: and then one of its phrasings (`training.phrasing_families.training_groups`: one group per family
    #: and register; `training.phrasings`: one group). ``extra_share`` is the share of that type's
    #: questions asked with one of them instead of a `TRAINING_QUESTIONS` phrasing.
    extra_questions: dict[str, tuple[tuple[str, ...], ...]] = field(default_factory=dict)
    extra_share: float = 0.0
    #: Share of training questions (any phrasing) with one or two filler or made-up words inserted
    #: (`training.phrasing_families.add_noise`), so that a word the model never saw is not a cue.
    question_noise: float = 0.0

    @property
    def image_size(self) -> int:
        return self.scenes.IMAGE_SIZE

    @property
    def num_image_tokens(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    def available_qtypes(self, scene) -> list[str]:
        """Question types that can be asked about ``scene`` (those about two shapes need two)."""
        two_shape_types = getattr(self.scenes, "TWO_SHAPE_TYPES", ())
        return [q for q in self.qtype_weights if q not in two_shape_types or scene.count >= 2]

    def question(self, scene, qtype: str, rng: np.random.Generator, scope: str):
        """(question, answer, shape spans the binding loss supervises under ``scope``)."""
        if scope not in ATTN_SCOPES:
            raise ValueError(f"attn_scope must be one of {ATTN_SCOPES}, not {scope!r}")
        if self.scenes is scenes:
            question, answer = scenes.make_question(scene, qtype, rng)
            return question, answer, binding_spans(scene, qtype, question, answer, scope)
        extra = self.extra_questions.get(qtype, ())
        # (rng.random() is drawn only when extras exist, so a world without them keeps its stream.)
        if extra and self.extra_share > 0 and rng.random() < self.extra_share:
            question, answer, spans = ask_in_family(self.scenes, scene, qtype, extra, rng)
        else:
            question, answer, spans = self.scenes.make_question_with_spans(scene, qtype, rng)
        if scope == "asked" and qtype not in self.scenes.ONE_SHAPE_TYPES:
            spans = []
        # (Drawn only with noise, so a world without it keeps its stream.)
        if self.question_noise > 0 and rng.random() < self.question_noise:
            question = add_noise(question, rng)
        return question, answer, spans

    def with_extra_questions(self, extra: dict[str, tuple], share: float) -> World:
        """This world asking ``share`` of each type's training questions with ``extra``'s phrasings: per
        type a tuple of phrasings (one group) or of groups of phrasings."""
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"the share of extra phrasings must be in [0, 1], not {share}")
        if share > 0 and not hasattr(self.scenes, "answer_with_spans"):
            raise ValueError(f"world {self.name!r} has no extra phrasings (only v2 does)")
        unknown = set(extra) - set(self.qtype_weights)
        if unknown:
            raise ValueError(f"no question type {sorted(unknown)} in world {self.name!r}")
        groups = {
            q: (tuple(v),) if all(isinstance(t, str) for t in v) else tuple(map(tuple, v))
            for q, v in extra.items()
        }
        if any(not g for gs in groups.values() for g in gs):
            raise ValueError("an extra phrasing group is empty")
        return replace(self, extra_questions=groups, extra_share=share)

    def with_training_mix(self, qtype_weights: dict[str, float] | None = None, noise: float = 0.0) -> World:
        """This world asking its question types in proportion to ``qtype_weights`` (every type of the
        world, normalised; None keeps the world's) and ``noise`` of its questions with inserted words."""
        if not 0.0 <= noise <= 1.0:
            raise ValueError(f"the question noise must be in [0, 1], not {noise}")
        weights = self.qtype_weights
        if qtype_weights is not None:
            if set(qtype_weights) != set(self.qtype_weights) or min(qtype_weights.values()) <= 0:
                raise ValueError(f"give a positive weight to each of {sorted(self.qtype_weights)}")
            total = sum(qtype_weights.values())
            weights = {q: qtype_weights[q] / total for q in self.qtype_weights}  # the world's order
        return replace(self, qtype_weights=weights, question_noise=noise)

    def overrides(self) -> dict:
        """What a training run changed of its `WORLDS` entry (for batch workers to rebuild it)."""
        names = ("qtype_weights", "extra_questions", "extra_share", "question_noise")
        return {name: getattr(self, name) for name in names}


WORLDS = {
    # Colour is the hardest v1 question, so it is asked most.
    "v1": World("v1", scenes, 8, 512, {"describe": 0.2, "colour": 0.35, "count": 0.15, "position": 0.3}),
    "v2": World(
        "v2",
        scenes2,
        12,
        768,
        {"describe": 0.1, "colour": 0.2, "count": 0.1, "position": 0.2, "relation": 0.2, "detail": 0.2},
    ),
}


def binding_spans(scene: scenes.Scene, qtype: str, question: str, answer: str, scope: str):
    """v1: character spans ``(start, end, shape_id)`` of ``answer`` that the binding loss supervises."""
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


# --------------------------------------------------------------------------------------------------
# Tokenizer and processor


def tokenizer_corpus(world: World, n_scenes: int = 3000, seed: int = 12345) -> list[str]:
    """Text to train the BPE on: chat-formatted turns (training phrasings only) about random scenes."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(n_scenes):
        scene = world.scenes.sample_scene(rng)
        for qtype in world.scenes.QUESTION_TYPES:
            if qtype in world.available_qtypes(scene):
                q, a = world.scenes.make_question(scene, qtype, rng)
                lines.append(f"USER: {q}\nASSISTANT: {a}\n")
    return lines


def build_tokenizer(world: World):
    """A byte-level BPE ``PreTrainedTokenizerFast`` (any text tokenizes) with the chat template."""
    from transformers import PreTrainedTokenizerFast

    tok = train_byte_level_bpe(tokenizer_corpus(world), world.vocab_size, SPECIAL_TOKENS)
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
        if fast.convert_tokens_to_ids(t) != i:
            raise RuntimeError(f"special token {t!r} did not get id {i}")
    return fast


def build_processor(tokenizer, world: World):
    """A ``LlavaProcessor`` with the PIL CLIP image processor at the world's image size (no crop)."""
    from transformers import LlavaProcessor

    try:
        from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
    except ImportError:  # older transformers: the one CLIP image processor class is PIL-based
        from transformers import CLIPImageProcessor as CLIPImageProcessorPil

    side = {"height": world.image_size, "width": world.image_size}
    image_processor = CLIPImageProcessorPil(size=side, do_center_crop=False, crop_size=side)
    return LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=world.patch_size,
        vision_feature_select_strategy="default",
        chat_template=CHAT_TEMPLATE,
        num_additional_image_tokens=1,  # CLIP's CLS token, dropped by the "default" strategy
    )


# --------------------------------------------------------------------------------------------------
# Sequences and targets


def pixel_values(images: list | np.ndarray, device: str | torch.device = "cpu") -> torch.Tensor:
    """(N, 3, H, W) float tensor on ``device``, normalised like the CLIP image processor, from PIL
    images or an (N, H, W, 3) uint8 array."""
    pixels = images if isinstance(images, np.ndarray) else np.stack([np.asarray(im) for im in images])
    x = torch.from_numpy(pixels).to(device).permute(0, 3, 1, 2).float() / 255.0
    mean = torch.tensor(CLIP_MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(CLIP_STD, device=x.device).view(1, 3, 1, 1)
    return ((x - mean) / std).contiguous()


def patch_targets(scene, world: World = WORLDS["v1"], min_pixels: int | None = None) -> dict[str, np.ndarray]:
    """Per-patch class ids (row-major): the dominant shape's colour/kind/size/cell + 1, 0 for background
    (a patch belongs to a shape covering at least ``min_pixels``, default a tenth of the patch);
    ``shape`` is the dominant shape's index + 1."""
    mod, p = world.scenes, world.patch_size
    min_pixels = max(1, p * p // 10) if min_pixels is None else min_pixels
    index = mod.shape_index_map(scene)
    g = world.image_size // p
    blocks = index.reshape(g, p, g, p).transpose(0, 2, 1, 3).reshape(g * g, p * p)
    counts = np.stack([(blocks == i + 1).sum(1) for i in range(scene.count)], axis=1)
    dominant = np.where(counts.max(1) >= min_pixels, counts.argmax(1) + 1, 0)
    ids = {
        "colour": [0] + [list(mod.COLOURS).index(s.colour) + 1 for s in scene.shapes],
        "kind": [0] + [mod.KINDS.index(s.kind) + 1 for s in scene.shapes],
        "size": [0] + [mod.SIZES.index(s.size) + 1 for s in scene.shapes],
        "cell": [0] + [s.cell + 1 for s in scene.shapes],
    }
    return {"shape": dominant, **{name: np.asarray(v)[dominant] for name, v in ids.items()}}


class SequenceBuilder:
    """Turns (question, answer) turns into token ids and labels that match the chat template exactly."""

    def __init__(self, tokenizer, num_image_tokens: int = 64):
        self.tok = tokenizer
        self.num_image_tokens = num_image_tokens
        self.cache: dict[str, list[int]] = {}
        self.offsets_cache: dict[str, tuple[list[int], list[tuple[int, int]]]] = {}
        self.bos, self.eos, self.image = (tokenizer.convert_tokens_to_ids(t) for t in (BOS, EOS, IMAGE))

    #: Entries kept per cache: v2 answers are mostly unique, so an unbounded cache would grow all run.
    CACHE_LIMIT = 20_000

    def encode(self, text: str) -> list[int]:
        if text not in self.cache:
            if len(self.cache) >= self.CACHE_LIMIT:
                self.cache.clear()
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
        ids = [self.bos] + self.encode("USER: ") + [self.image] * self.num_image_tokens
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
            if len(self.offsets_cache) >= self.CACHE_LIMIT:
                self.offsets_cache.clear()
            enc = self.tok(text, add_special_tokens=False, return_offsets_mapping=True)
            self.offsets_cache[text] = (enc["input_ids"], [tuple(o) for o in enc["offset_mapping"]])
        return self.offsets_cache[text]

    @property
    def image_offset(self) -> int:
        """Index of the first image token in every built sequence."""
        return 1 + len(self.encode("USER: "))


# --------------------------------------------------------------------------------------------------
# Batches


def training_scene_seed(rng: np.random.Generator) -> int:
    """A training scene seed, always below the held-out seed range (disjoint from held-out seeds)."""
    return int(rng.integers(scenes.HELDOUT_SEED_START))


def draw_seeds(rng: np.random.Generator, batch: int) -> list[int]:
    """The scene seeds of the next batch (all training seeds)."""
    return [training_scene_seed(rng) for _ in range(batch)]


def batch_from_seeds(
    seeds: list[int], world: World, builder: SequenceBuilder, attn_scope: str = "asked"
) -> dict[str, np.ndarray | dict[str, np.ndarray]]:
    """Packed sequences (1-3 questions each) about the scenes of ``seeds``, as numpy arrays (right
    padding): ``input_ids``, ``labels`` (-100 outside answers), ``attention_mask``, ``pixels`` (uint8
    images, N x H x W x 3: a quarter of the bytes of float pixels to pass between processes),
    ``aux`` (per-patch targets) and ``attn_target[n, t, p]``: True where position ``t`` predicts an
    answer token about one shape and image patch ``p`` shows that shape."""
    qtype_list = list(world.qtype_weights)
    images, seqs, targets = [], [], []
    for seed in seeds:
        scene_rng = np.random.default_rng(seed)
        scene = world.scenes.sample_scene(scene_rng)
        available = [q for q in qtype_list if q in world.available_qtypes(scene)]
        weights = np.array([world.qtype_weights[q] for q in available])
        if len(available) < len(qtype_list):  # (v1 always has them all: its stream stays as it was)
            weights = weights / weights.sum()
        n_turns = min(int(scene_rng.integers(1, MAX_TURNS + 1)), len(available))
        picked = scene_rng.choice(len(available), size=n_turns, replace=False, p=weights)
        asked = [world.question(scene, available[k], scene_rng, attn_scope) for k in picked]
        images.append(world.scenes.render_scene(scene))
        seqs.append(builder.build([(q, a) for q, a, _ in asked], [s for _, _, s in asked]))
        targets.append(patch_targets(scene, world))
    n, length, p = len(seeds), max(len(ids) for ids, _, _ in seqs), world.num_image_tokens
    input_ids = np.zeros((n, length), dtype=np.int64)
    labels = np.full((n, length), -100, dtype=np.int64)
    mask = np.zeros((n, length), dtype=np.int64)
    attn_target = np.zeros((n, length, p), dtype=bool)
    for i, (ids, lab, focus) in enumerate(seqs):
        input_ids[i, : len(ids)], labels[i, : len(lab)], mask[i, : len(ids)] = ids, lab, 1
        focus_arr = np.asarray(focus)
        rows = np.nonzero(focus_arr)[0]
        attn_target[i, rows] = targets[i]["shape"][None, :] == focus_arr[rows, None]
    aux = {k: np.stack([t[k] for t in targets]).astype(np.int64) for k in targets[0] if k != "shape"}
    return {
        "input_ids": input_ids,
        "labels": labels,
        "attention_mask": mask,
        "pixels": np.stack([np.asarray(im, dtype=np.uint8) for im in images]),
        "aux": aux,
        "attn_target": attn_target,
    }


def to_torch(batch: dict, device: str | torch.device = "cpu") -> dict:
    """The numpy batch of `batch_from_seeds` as tensors on ``device``; ``pixels`` become the model's
    normalised ``pixel_values``."""
    out = {}
    for k, v in batch.items():
        if k == "pixels":
            out["pixel_values"] = pixel_values(v, device)
        else:
            out[k] = to_torch(v, device) if isinstance(v, dict) else torch.from_numpy(v).to(device)
    return out


def sample_batch(
    rng: np.random.Generator,
    builder: SequenceBuilder,
    batch: int,
    attn_scope: str = "asked",
    world: World = WORLDS["v1"],
) -> dict[str, torch.Tensor]:
    """A batch of ``batch`` fresh training scenes (tensors on the CPU)."""
    return to_torch(batch_from_seeds(draw_seeds(rng, batch), world, builder, attn_scope))
