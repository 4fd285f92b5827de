"""Train and evaluate the embedded default model: a tiny LLaVA that reads synthetic shape scenes.

Usage::

    python -m training.train --out assets/models/tiny-scenes-llava --steps 2400 --seed 1 \\
        --attn-weight 1.0 --attn-scope mentions                      # v1 (the shipped model)
    python -m training.train --world v2 --out runs/v2 --steps 3000 --batch 128 --device cuda \\
        --workers 4 --attn-weight 1.0 --attn-scope mentions          # v2 (training/train_v2_gpu.sh)
    python -m training.train --eval assets/models/tiny-scenes-llava --n-per-type 50

The saved folder is a plain ``LlavaForConditionalGeneration`` (CLIP vision tower + Llama text model,
sdpa attention) with a byte-level BPE tokenizer, a ``LlavaProcessor`` and a generation config; it loads
offline with ``AutoProcessor`` / ``AutoModelForImageTextToText``. Training adds what is not saved: a
per-patch head predicting the colour, kind, size and cell of the shape under each image token, and a
binding loss that points one attention head at the shape an answer token is about.

Training is step-driven and seeded (scene seeds from ``numpy.random.default_rng(seed)``, all below the
held-out range); the loss covers answer tokens (and their eos) only; 1-3 questions about one image are
packed into one multi-turn sequence whose first turn is exactly the inference prompt. On a CPU with the
same seed and thread count the weights are bit-identical whatever ``--workers`` is.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from training.batch_stream import BatchStream
from training.config import PHRASINGS, TrainConfig, parse_weights
from training.data import (
    ATTN_SCOPES,
    IMAGE,
    SPECIAL_TOKENS,
    WORLDS,
    SequenceBuilder,
    World,
    build_processor,
    build_tokenizer,
    to_torch,
)
from training.evaluate import evaluate, folder_size, load, world_of, write_examples

logger = logging.getLogger(__name__)


def build_model(vocab_size: int, cfg: TrainConfig, world: World):
    """A randomly initialised tiny ``LlavaForConditionalGeneration`` of ``cfg``'s sizes."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    vision = CLIPVisionConfig(
        hidden_size=cfg.vision_hidden,
        intermediate_size=4 * cfg.vision_hidden,
        num_hidden_layers=cfg.vision_layers,
        num_attention_heads=4,
        image_size=world.image_size,
        patch_size=world.patch_size,
        projection_dim=cfg.vision_hidden,
    )
    text = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden,
        intermediate_size=cfg.mlp,
        num_hidden_layers=cfg.layers,
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
        image_seq_length=world.num_image_tokens,
        tie_word_embeddings=True,
    )
    torch.manual_seed(cfg.seed)
    model = LlavaForConditionalGeneration(config)
    model.generation_config.update(
        bos_token_id=1, eos_token_id=2, pad_token_id=0, do_sample=False, max_new_tokens=64
    )
    return model


class PatchHead(nn.Module):
    """Training-only head: per image token, logits for colour, kind, size and cell of the shape below."""

    def __init__(self, dim: int, world: World = WORLDS["v1"]):
        super().__init__()
        mod = world.scenes
        self.sizes = {
            "colour": len(mod.COLOURS) + 1,
            "kind": len(mod.KINDS) + 1,
            "size": len(mod.SIZES) + 1,
            "cell": len(mod.POSITIONS) + 1,
        }
        self.heads = nn.ModuleDict({k: nn.Linear(dim, n) for k, n in self.sizes.items()})

    def loss(self, features: torch.Tensor, targets: dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean cross-entropy over heads; features (N, P, D), targets (N, P) ints, 0 = background."""
        losses = [
            F.cross_entropy(self.heads[k](features).flatten(0, 1).float(), targets[k].flatten())
            for k in self.heads
        ]
        return sum(losses) / len(losses)


def lr_at(step: int, cfg: TrainConfig, elapsed_s: float = 0.0) -> float:
    """Linear warmup then cosine decay to ``min_lr_ratio * lr``. With a time limit, the decay follows
    whichever runs out first, steps or time, so a run stopped by the clock still ends annealed."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    if cfg.time_limit_s > 0:
        progress = min(1.0, max(progress, elapsed_s / cfg.time_limit_s))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def attention_loss(
    attentions: tuple[torch.Tensor, ...], layers: tuple[int, ...], target: torch.Tensor, offset: int
):
    """Binding loss: ``-log`` of the attention mass head 0 of each of ``layers`` puts on the target
    patches, averaged over the positions that have a target (``target``: (N, L, P) bool)."""
    rows = target.any(-1)
    if not rows.any():
        return attentions[0].new_zeros(()).float()
    tgt = target[rows].float()
    n_patches = target.shape[-1]
    losses = []
    for layer in layers:
        weights = attentions[layer][:, 0, :, offset : offset + n_patches].float()  # (N, L, P)
        mass = (weights[rows] * tgt).sum(-1)
        losses.append(-torch.log(mass + 1e-6).mean())
    return sum(losses) / len(losses)


def lead_mask(labels: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """True at the first ``n_tokens`` answer tokens of every answer: ``labels`` (N, L) is -100 outside
    answers, and each answer (with its eos) is one run of other labels."""
    answer = labels != -100
    start = answer.clone()
    start[:, 1:] &= ~answer[:, :-1]
    lead = start.clone()
    for k in range(1, n_tokens):
        lead[:, k:] |= start[:, :-k]
    return lead & answer


def answer_loss(logits: torch.Tensor, labels: torch.Tensor, cfg: TrainConfig):
    """Mean cross-entropy of ``logits`` (N * L, V) against ``labels`` (N, L) over answer tokens, the
    first `TrainConfig.lead_tokens` of each answer counted `TrainConfig.lead_weight` times (plain mean
    at weight 1)."""
    flat_labels = labels.flatten()
    if cfg.lead_weight == 1.0:
        return F.cross_entropy(logits, flat_labels, ignore_index=-100)
    per_token = F.cross_entropy(logits, flat_labels, ignore_index=-100, reduction="none")
    weights = 1.0 + (cfg.lead_weight - 1.0) * lead_mask(labels, cfg.lead_tokens).flatten().float()
    answer = flat_labels != -100
    return (per_token * weights)[answer].sum() / answer.sum().clamp(min=1)


def train_step(model, head: PatchHead, batch: dict, cfg: TrainConfig, image_offset: int):
    """Forward one batch; returns (answer-token LM loss, auxiliary patch loss, attention binding loss).
    The patch loss is 0 when `TrainConfig.uses_patch_loss` is false."""
    captured: list[torch.Tensor] = []
    # The projector output is exactly what the language model receives as image tokens: (N, P, D).
    hook = model.model.multi_modal_projector.register_forward_hook(lambda _m, _i, out: captured.append(out))
    supervise_attention = cfg.attn_weight > 0
    device_type = torch.device(cfg.device).type
    try:
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=cfg.bf16):
            out = model(
                input_ids=batch["input_ids"],
                pixel_values=batch["pixel_values"],
                attention_mask=batch["attention_mask"],
                output_attentions=supervise_attention,
            )
            logits = out.logits[:, :-1].float()
            lm_loss = answer_loss(logits.flatten(0, 1), batch["labels"][:, 1:], cfg)
            aux_loss = head.loss(captured[0], batch["aux"]) if cfg.uses_patch_loss else lm_loss.new_zeros(())
            if supervise_attention:
                attn_loss = attention_loss(
                    out.attentions, cfg.attn_layers, batch["attn_target"], image_offset
                )
            else:
                attn_loss = lm_loss.new_zeros(())
    finally:
        hook.remove()
    return lm_loss, aux_loss, attn_loss


def initial_model(cfg: TrainConfig, world: World):
    """(processor, model) to train: a fresh model of ``cfg``'s sizes, or the one saved in ``cfg.init``
    (which must be of ``world``). With ``cfg.freeze_vision`` the vision tower and projector are frozen."""
    if cfg.init:
        processor, model = load(Path(cfg.init))
        if world_of(model).name != world.name:
            raise ValueError(f"{cfg.init} holds a model of world {world_of(model).name}, not {world.name}")
    else:
        processor = build_processor(build_tokenizer(world), world)
        model = build_model(len(processor.tokenizer), cfg, world)
    if cfg.freeze_vision:
        for part in (model.model.vision_tower, model.model.multi_modal_projector):
            part.requires_grad_(False)
    return processor, model


def train(out_dir: Path, cfg: TrainConfig) -> dict:
    """Train for ``cfg.steps`` steps (fewer if ``time_limit_s`` runs out), from scratch or from
    ``cfg.init``, and save model, processor and tokenizer in ``out_dir``; returns a summary (steps done,
    last losses, seconds)."""
    t0 = time.perf_counter()
    torch.set_num_threads(cfg.threads)
    world = WORLDS[cfg.world]
    if cfg.extra_phrasing_share > 0:
        world = world.with_extra_questions(PHRASINGS[cfg.phrasings](), cfg.extra_phrasing_share)
    if cfg.question_noise > 0 or cfg.qtype_weights:
        weights = parse_weights(cfg.qtype_weights) if cfg.qtype_weights else None
        world = world.with_training_mix(weights, cfg.question_noise)
    processor, model = initial_model(cfg, world)
    builder = SequenceBuilder(processor.tokenizer, world.num_image_tokens)
    # Batch workers start before CUDA is initialised in this process.
    rng = np.random.default_rng(cfg.seed)
    stream = BatchStream(rng, world, builder, cfg.batch, cfg.attn_scope, cfg.workers)
    model = model.to(cfg.device)
    head = PatchHead(model.config.text_config.hidden_size, world).to(cfg.device)
    n_params = sum(p.numel() for p in model.parameters())
    logger.info("model: %.2fM parameters, vocab %d, %s", n_params / 1e6, len(processor.tokenizer), cfg)
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.uses_patch_loss:
        params += list(head.parameters())
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
    )
    if cfg.attn_weight > 0:
        model.set_attn_implementation("eager")  # attention weights are only returned by eager attention
    model.train()
    losses: dict[str, float] = {}
    t_start = time.perf_counter()
    step = 0
    try:
        for step in range(cfg.steps):
            lr = lr_at(step, cfg, time.perf_counter() - t_start)
            for group in optimizer.param_groups:
                group["lr"] = lr
            batch = to_torch(next(stream), cfg.device)
            lm_loss, aux_loss, attn_loss = train_step(model, head, batch, cfg, builder.image_offset)
            optimizer.zero_grad(set_to_none=True)
            (lm_loss + cfg.aux_weight * aux_loss + cfg.attn_weight * attn_loss).backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            last = step == cfg.steps - 1
            out_of_time = cfg.time_limit_s > 0 and time.perf_counter() - t_start > cfg.time_limit_s
            if step % cfg.log_every == 0 or last or out_of_time:
                losses = {"lm": lm_loss.item(), "aux": aux_loss.item(), "attn": attn_loss.item()}
                logger.info(
                    "step %d/%d %s lr %.2e %.0fs",
                    step,
                    cfg.steps,
                    " ".join(f"{k} {v:.4f}" for k, v in losses.items()),
                    lr,
                    time.perf_counter() - t0,
                )
            if out_of_time and not last:
                logger.warning(
                    "time limit %.0fs reached: stopping after step %d of %d",
                    cfg.time_limit_s,
                    step,
                    cfg.steps,
                )
                break
    finally:
        stream.close()
    model.set_attn_implementation("sdpa")
    save(model.to("cpu").eval(), processor, out_dir)
    return {"steps_done": step + 1, "steps": cfg.steps, "losses": losses, "seconds": time.perf_counter() - t0}


def save(model, processor, out_dir: Path) -> None:
    """Write config, fp32 safetensors, generation config, tokenizer and processor files."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    processor.save_pretrained(out_dir)
    logger.info("saved to %s (%.2f MB)", out_dir, folder_size(out_dir) / 1e6)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="train and save the model here")
    parser.add_argument("--eval", type=Path, help="evaluate the model saved here")
    parser.add_argument("--examples", type=Path, help="write example scenes and prompts.json here")
    parser.add_argument("--world", choices=sorted(WORLDS), default=TrainConfig.world, help="scene world")
    d = TrainConfig()
    for name in (
        "steps",
        "batch",
        "seed",
        "threads",
        "warmup",
        "hidden",
        "layers",
        "mlp",
        "vision_hidden",
        "vision_layers",
        "workers",
        "log_every",
    ):
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(d, name))
    parser.add_argument("--lr", type=float, default=d.lr)
    parser.add_argument(
        "--aux-weight",
        type=float,
        default=d.aux_weight,
        help="weight of the per-patch colour/kind/size/cell loss",
    )
    parser.add_argument(
        "--attn-weight",
        type=float,
        default=d.attn_weight,
        help="weight of the binding loss on head 0 of layers 1-2 (0 = off)",
    )
    parser.add_argument(
        "--attn-scope",
        choices=ATTN_SCOPES,
        default=d.attn_scope,
        help="answer tokens the binding loss supervises",
    )
    parser.add_argument(
        "--init", default=d.init, help="fine-tune the model saved in this folder (its sizes and tokenizer)"
    )
    parser.add_argument(
        "--extra-phrasing-share",
        type=float,
        default=d.extra_phrasing_share,
        help="share of each type's questions asked with generated phrasings (see --phrasings)",
    )
    parser.add_argument(
        "--phrasings",
        choices=sorted(PHRASINGS),
        default=d.phrasings,
        help="generator of the extra phrasings: frames (training/phrasings.py), families "
        "(the training families of training/phrasing_families.py), mixed (both), mixed-plus "
        "(mixed and the extra relation families) mixed-roles (mixed-plus and the role families of "
        "training/phrasing_extra.py) or mixed-from (mixed-plus and its from-families)",
    )
    parser.add_argument(
        "--question-noise",
        type=float,
        default=d.question_noise,
        help="share of training questions with a filler or made-up word or two inserted (v2)",
    )
    parser.add_argument(
        "--qtype-weights",
        default=d.qtype_weights,
        help="how often each question type is asked: describe=0.1,colour=0.2,... (v2; default: the world's)",
    )
    parser.add_argument(
        "--lead-weight",
        type=float,
        default=d.lead_weight,
        help="weight of the loss on the first --lead-tokens tokens of each answer (1 = plain mean)",
    )
    parser.add_argument(
        "--lead-tokens", type=int, default=d.lead_tokens, help="answer tokens --lead-weight covers"
    )
    parser.add_argument(
        "--freeze-vision",
        action="store_true",
        help="train the language model only (vision tower and projector frozen, no per-patch loss)",
    )
    parser.add_argument("--device", default=d.device, help="torch device to train (and --eval) on, e.g. cuda")
    parser.add_argument(
        "--time-limit-s",
        type=float,
        default=d.time_limit_s,
        help="safety stop: save what is trained when this many seconds have passed",
    )
    parser.add_argument("--n-per-type", type=int, default=50)
    parser.add_argument("--heldout-seed", type=int, default=0, help="which held-out set --eval uses")
    parser.add_argument("--failures", type=int, default=0, help="wrong answers per type to show in --eval")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not (args.out or args.eval or args.examples):
        parser.error("give --out DIR (train), --eval DIR and/or --examples DIR")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: CUDA is not available here")
    if args.examples:
        print(json.dumps(write_examples(args.examples, world=WORLDS[args.world]), indent=2))
    if args.out:
        fields = {k: getattr(args, k) for k in TrainConfig.__dataclass_fields__ if hasattr(args, k)}
        try:
            cfg = TrainConfig(**fields)
        except ValueError as err:
            parser.error(str(err))
        summary = train(args.out, cfg)
        print(json.dumps({"out": str(args.out), **summary}))
    if args.eval:
        print(
            json.dumps(
                evaluate(args.eval, args.n_per_type, args.heldout_seed, args.device, args.failures), indent=2
            )
        )


if __name__ == "__main__":
    main()
