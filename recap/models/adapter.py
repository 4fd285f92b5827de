"""The model adapter (with its cache, `recap.models.kv_cache`, the only code that imports transformers).

`TargetModel` wraps a Hugging Face vision-language (or text) model and gives the decode loop four
verbs:

- ``prepare(images, prompt)``: chat template + processor -> model inputs;
- ``prefill(inputs)``: one pass over the prompt -> a `RequestState` (KV cache, positions) and logits
  at the prompt's text positions;
- ``forward_tree(state, pending, tree)``: ONE pass over ``[pending committed tokens] + [tree nodes]``
  with an additive float 4-D mask (each node sees the cache, the pending tokens and its own ancestors;
  sliding-window layers only those within the window, in the form the model takes: `AttentionLayout`)
  and explicit position ids (sequence index ``cached + pending - 1 + depth``, numbered by the family's
  position scheme: as is, or for Qwen2/2.5-VL the 3-row mRoPE ids shifted by this request's rope
  delta) -> logits ``(P + N, vocab)``;
- ``commit(state, pending, accepted_nodes)``: keep the accepted nodes' KV entries (gather into place,
  then crop the rest).

The cache is a `recap.models.kv_cache.GrowingCache`; a pass with no tree nodes builds no mask (the model's own
causal mask is exact); `Family.direct_decoder` (LLaVA) runs decode passes as embedding -> decoder -> head.

Why an additive float mask: with ``eager`` attention a bool 4-D mask is silently wrong, and
``flash_attention_2`` cannot express a tree at all. Why explicit positions: without them LLaVA and
Idefics3 silently use sequential positions and Qwen2.5-VL crashes. What differs between families
(prompting, image tokens, position scheme, attention layout) lives in `recap.models.families`, one row each.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from recap.memory.fingerprint import tokenizer_fingerprint
from recap.models.cost import COST_SIZES
from recap.models.families import AttentionLayout, family_of, placeholder_ids
from recap.tree import DraftTree

log = logging.getLogger(__name__)


def supported_attention(model_class: type | None, requested: str) -> str:
    """``requested``, unless ``model_class`` cannot run it: Gemma2 refuses ``sdpa`` (it soft-caps
    attention scores, which sdpa cannot), so it gets ``eager``, which takes the same additive mask."""
    if requested == "sdpa" and model_class is not None and not getattr(model_class, "_supports_sdpa", True):
        log.info("%s does not support sdpa attention; using eager", model_class.__name__)
        return "eager"
    return requested


def input_device(model: Any) -> torch.device:
    """The device that runs the input embedding, where every input tensor must be placed.

    On one device that is the embedding weight's device. A model dispatched by accelerate
    (``device_map="auto"``) may hold the embedding offloaded (its weight on the meta device); accelerate
    then runs it on the map's first accelerator, or on the CPU when the map has none.
    """
    device = model.get_input_embeddings().weight.device
    if device.type != "meta":
        return device
    placed = [d for d in getattr(model, "hf_device_map", {}).values() if d not in ("cpu", "disk")]
    return torch.device(placed[0] if placed else "cpu")


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def parse_dtype(name: str | torch.dtype | None, device: str) -> torch.dtype:
    """``None`` -> bf16 on GPU, fp32 on CPU; otherwise one of float32/bfloat16/float16 (or fp32/bf16/fp16)."""
    if isinstance(name, torch.dtype):
        return name
    if name is None or name == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    aliases = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
    name = aliases.get(name, name)
    if name not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"unknown dtype {name!r}; use float32, bfloat16 or float16")
    return getattr(torch, name)


@dataclass
class RequestState:
    """Per-request model state. ``cached``: KV entries in ``cache`` (== the next sequence index);
    ``position_offset``: what the family's position scheme adds after the prompt (mRoPE's delta)."""

    cache: Any
    cached: int
    input_ids: list[int]
    position_offset: torch.Tensor | None = None


class TargetModel:
    """A loaded target model, its processor, and the tree-verification verbs (see module docstring)."""

    def __init__(self, model: Any, processor: Any, name: str = "model") -> None:
        self.model = model.eval()
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.name = name
        self.model_type = model.config.model_type
        #: The family-table row (prompting, image tokens, position scheme); ``family`` is its name.
        self.family_spec = family_of(self.model_type)
        self.family = self.family_spec.name
        #: Where inputs, masks and positions go: the input embedding's device (see `input_device`).
        self.device = input_device(model)
        self.dtype = next(model.parameters()).dtype
        self.text_config = model.config.get_text_config()
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.eos_ids = self._eos_ids()
        self.excluded_ids = self._vision_token_ids()
        self.attention = AttentionLayout.of(self.text_config)
        self._pieces: dict[int, str] = {}
        # Decode passes skip the wrapper where the family allows it and one device holds the model.
        direct = self.family_spec.direct_decoder and not getattr(model, "hf_device_map", None)
        self._decoder = model.get_decoder() if direct else None
        self._embed, self._head = model.get_input_embeddings(), model.get_output_embeddings()

    # ------------------------------------------------------------------------------------- loading
    @classmethod
    def load(
        cls,
        name_or_path: str,
        device: str | None = None,
        dtype: str | torch.dtype | None = None,
        attn_implementation: str = "sdpa",
        gguf_file: str | None = None,
        device_map: str | None = None,
        max_memory: dict[int | str, int | str] | None = None,
        offload_folder: str | None = None,
        processor_options: dict[str, Any] | None = None,
    ) -> TargetModel:
        """Load by hub id or local directory. Raises ``ValueError`` with a readable reason on failure.

        ``device_map=None`` (default) puts the whole model on ``device``. ``device_map="auto"`` lets
        accelerate place it for a model one device cannot hold: split across the visible GPUs, the
        rest offloaded to CPU memory (and to ``offload_folder`` on disk if that is short too);
        ``max_memory`` caps each device (``{0: "20GiB", "cpu": "60GiB"}``, e.g. to leave room for
        the KV cache). Inputs then go to the input embedding's device (`input_device`).
        ``processor_options`` override a vision model's processor settings as it loads (e.g.
        ``{"do_image_splitting": False}``: an Idefics3 image is one tile instead of up to 17).
        """
        import transformers
        from transformers import AutoConfig

        if attn_implementation not in ("sdpa", "eager"):
            raise ValueError("attn_implementation must be 'sdpa' or 'eager' (a tree mask needs one of them)")
        looks_local = name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1
        if looks_local and not Path(name_or_path).expanduser().is_dir():
            raise ValueError(f"model directory not found: {name_or_path}")
        if device_map not in (None, "auto"):
            raise ValueError(f"device_map must be 'auto' or left unset, got {device_map!r}")
        if device_map and device:
            raise ValueError("give either a device or device_map='auto', not both")
        device = device or default_device()
        torch_dtype = parse_dtype(dtype, device)
        extra = {"gguf_file": gguf_file} if gguf_file else {}
        processor_options = processor_options or {}
        placement = (
            {"device_map": device_map, "max_memory": max_memory, "offload_folder": offload_folder}
            if device_map
            else {}
        )
        try:
            config = AutoConfig.from_pretrained(name_or_path, **extra)
        except (OSError, ValueError) as error:
            raise ValueError(f"cannot load model {name_or_path!r}: {_first_line(error)}") from None
        model_type = config.model_type
        vision = family_of(model_type).vision
        auto = transformers.AutoModelForImageTextToText if vision else transformers.AutoModelForCausalLM
        # config class -> model class, as from_pretrained resolves it
        model_class = auto._model_mapping.get(type(config), None)
        attn_implementation = supported_attention(model_class, attn_implementation)
        where = "device_map=auto" if device_map else device
        log.info("loading %s (%s) on %s in %s", name_or_path, model_type, where, torch_dtype)
        try:
            model = auto.from_pretrained(
                name_or_path, dtype=torch_dtype, attn_implementation=attn_implementation, **extra, **placement
            )
            if not device_map:
                model = model.to(device)
            if vision:
                processor = transformers.AutoProcessor.from_pretrained(name_or_path, **processor_options)
            else:
                processor = transformers.AutoTokenizer.from_pretrained(name_or_path, **extra)
        except (OSError, ValueError) as error:
            raise ValueError(f"cannot load model {name_or_path!r}: {_first_line(error)}") from None
        return cls(model, processor, name=str(name_or_path))

    # ---------------------------------------------------------------------------------- properties
    def _eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        for source in (getattr(self.model, "generation_config", None), self.model.config, self.text_config):
            value = getattr(source, "eos_token_id", None) if source is not None else None
            if value is not None:
                ids.update([value] if isinstance(value, int) else value)
        if not ids and getattr(self.tokenizer, "eos_token_id", None) is not None:
            ids.add(self.tokenizer.eos_token_id)
        return frozenset(int(i) for i in ids)

    def _vision_token_ids(self) -> frozenset[int]:
        ids = set(placeholder_ids(self.model.config))
        vocab = self.tokenizer.get_vocab() if hasattr(self.tokenizer, "get_vocab") else {}
        for token in self.family_spec.image_tokens:
            if token in vocab:
                ids.add(int(vocab[token]))
        prefix = self.family_spec.image_token_prefix
        if prefix:  # tile markers such as <row_1_col_2>
            ids.update(int(i) for t, i in vocab.items() if t.startswith(prefix) and t.endswith(">"))
        return frozenset(ids)

    def fingerprint(self) -> str:
        """Identifies the tokenizer (vocabulary + special tokens): saved memories must match it."""
        return tokenizer_fingerprint(self.model_type, self.vocab_size, self.tokenizer.get_vocab())

    def token_text(self, token_ids: Sequence[int]) -> list[str]:
        """Each token's decoded text piece (for display; memoised, the studio asks for every node)."""
        pieces = []
        for token in token_ids:
            piece = self._pieces.get(int(token))
            if piece is None:
                piece = self._pieces[int(token)] = self.tokenizer.decode(
                    [int(token)], skip_special_tokens=False
                )
            pieces.append(piece)
        return pieces

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode([int(t) for t in token_ids], skip_special_tokens=True)

    # ----------------------------------------------------------------------------------- prefill
    def prepare(self, images: Sequence[Image.Image], prompt: str) -> dict[str, torch.Tensor]:
        """Apply the chat template and processor to one prompt with 0+ images -> model inputs (batch 1)."""
        if not self.family_spec.vision:
            if images:
                raise ValueError(
                    f"{self.name} is a text-only model: remove the image or choose a vision model"
                )
            if getattr(self.tokenizer, "chat_template", None):
                text = self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
                )
            else:
                text = prompt
            inputs = dict(self.tokenizer(text, return_tensors="pt", add_special_tokens=False))
        else:
            content: list[dict[str, str]] = [{"type": "image"} for _ in images]
            content.append({"type": "text", "text": prompt})
            messages = [{"role": "user", "content": content}]
            text = self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            kwargs = {"images": list(images)} if images else {}
            inputs = dict(self.processor(text=[text], return_tensors="pt", **kwargs))
        inputs.pop("token_type_ids", None)
        return {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}

    @torch.inference_mode()
    def prefill(
        self, inputs: dict[str, torch.Tensor], keep: Sequence[int]
    ) -> tuple[RequestState, torch.Tensor]:
        """Run the prompt; return the request state and float32 logits at prompt positions ``keep``.

        ``keep`` must include the last position (its logits give the first generated token).
        """
        from recap.models.kv_cache import GrowingCache

        input_ids = inputs["input_ids"]
        length = int(input_ids.shape[1])
        kwargs = dict(inputs)
        kwargs["position_ids"], offset = self.family_spec.positions.prompt(self.model, inputs)
        # Every layer is held in full; sliding windows are applied by masks.
        cache = GrowingCache()
        # On the CPU: the final hidden states may sit on another device than the inputs (device_map),
        # and a CPU index selects from a tensor on any device.
        keep_index = torch.as_tensor(list(keep), dtype=torch.long)
        out = self.model(**kwargs, cache=cache, use_cache=True, logits_to_keep=keep_index)
        state = RequestState(
            cache=cache, cached=length, input_ids=input_ids[0].tolist(), position_offset=offset
        )
        return state, out.logits[0].float()

    # ----------------------------------------------------------------------------- tree verification
    @torch.inference_mode()
    def forward_tree(self, state: RequestState, pending: Sequence[int], tree: DraftTree) -> torch.Tensor:
        """Logits ``(P + N, vocab)`` (float32) for the pending tokens then every tree node, in ONE pass.

        Appends P + N entries to the cache; `commit` must follow before the next pass.
        """
        n_pending, n_nodes = len(pending), len(tree)
        past = state.cached
        input_ids = torch.tensor([[*pending, *tree.tokens]], dtype=torch.long, device=self.device)
        if n_nodes:
            positions = np.concatenate([past + np.arange(n_pending), past + n_pending - 1 + tree.depths])
            position_ids = torch.as_tensor(positions, dtype=torch.long, device=self.device)[None]
            # Visibility among the new tokens; everything already cached is visible to all of them.
            new = np.zeros((n_pending + n_nodes, n_pending + n_nodes), dtype=bool)
            new[:n_pending, :n_pending] = np.tri(n_pending, dtype=bool)
            new[n_pending:, :n_pending] = True
            new[n_pending:, n_pending:] = tree.ancestor_mask()
            mask = self._tree_masks(new, past, positions)
        else:  # a plain chain of pending tokens: the model's own (windowed) causal mask is exact
            position_ids, mask = torch.arange(past, past + n_pending, device=self.device)[None], None
        position_ids = self.family_spec.positions.extend(position_ids, state.position_offset)
        logits = self._forward(input_ids, mask, position_ids, state.cache)
        state.cached = past + n_pending + n_nodes
        return logits[0].float()

    def _forward(self, ids: torch.Tensor, mask: Any, position_ids: torch.Tensor, cache: Any) -> torch.Tensor:
        """Logits ``(1, T, vocab)`` of one pass over text tokens after the prefill (no images)."""
        common = {"attention_mask": mask, "position_ids": position_ids, "cache": cache, "use_cache": True}
        if self._decoder is None:
            return self.model(input_ids=ids, **common).logits
        hidden = self._decoder(inputs_embeds=self._embed(ids), **common).last_hidden_state
        return self._head(hidden)

    def _tree_masks(self, new: np.ndarray, past: int, positions: np.ndarray) -> Any:
        """The 4-D mask(s) the text model takes for ``new`` (visibility among the new tokens).

        One tensor for models that mask every layer alike (windowed when the model has a window);
        a dict keyed by the config's layer types for models that look masks up per layer.
        """
        layout = self.attention
        full = windowed = None
        if layout.window is not None:
            # Sequence indices, as in sequential decoding: a node sits at its path's position.
            key_positions = np.concatenate([np.arange(past), positions])
            in_window = positions[:, None] - key_positions[None, :] < layout.window
            visible = np.concatenate([np.ones((len(positions), past), dtype=bool), new], axis=1)
            windowed = self._additive(visible & in_window, 0)
        if layout.window is None or "full_attention" in (layout.layer_types or ()):
            full = self._additive(new, past)
        if layout.layer_types is None:
            return windowed if windowed is not None else full
        masks = {"full_attention": full, "sliding_attention": windowed}
        return {kind: masks[kind] for kind in layout.layer_types}

    def _additive(self, visible: np.ndarray, past: int) -> torch.Tensor:
        """Additive mask ``(1, 1, T, past + K)`` from bool visibility ``(T, K)`` of the last K keys.

        0 where visible, the dtype's minimum elsewhere; the first ``past`` keys are visible to all rows.
        """
        rows, cols = visible.shape
        mask = torch.zeros((rows, past + cols), dtype=self.dtype, device=self.device)
        hidden = torch.as_tensor(~visible, device=self.device)
        mask[:, past:].masked_fill_(hidden, torch.finfo(self.dtype).min)
        return mask[None, None]

    @torch.inference_mode()
    def commit(self, state: RequestState, n_nodes: int, accepted: Sequence[int]) -> None:
        """After `forward_tree`: keep the pending tokens' and the accepted nodes' KV entries, drop the rest.

        Accepted node ``accepted[i]`` moves to slot ``base + i`` (``base`` = cache length before the
        nodes), then the cache is cropped to ``base + len(accepted)``.
        """
        base = state.cached - n_nodes
        if list(accepted) != list(range(len(accepted))):
            source = torch.as_tensor([base + n for n in accepted], dtype=torch.long)
            target = slice(base, base + len(accepted))
            for layer in state.cache.layers:  # each layer's cache lives on its layer's device
                index = source.to(layer.keys.device)
                layer.keys[:, :, target] = layer.keys.index_select(2, index)
                layer.values[:, :, target] = layer.values.index_select(2, index)
        drop = n_nodes - len(accepted)
        if drop:
            state.cache.crop(-drop)
        state.cached = base + len(accepted)

    # ------------------------------------------------------------------------------ teacher forcing
    @torch.inference_mode()
    def teacher_forced_greedy(
        self, images: Sequence[Image.Image], prompt: str, answer: Sequence[int]
    ) -> list[int]:
        """The target's greedy token at each position of ``answer``, with ``answer`` forced as context.

        One ordinary forward over ``prompt + answer[:-1]`` with the given images. Comparing the result
        under another image with ``answer`` marks the image-sensitive positions (docs/results.md, Columns).
        """
        if not answer:
            return []
        inputs = self.prepare(images, prompt)
        length = int(inputs["input_ids"].shape[1])
        forced = torch.tensor([list(answer[:-1])], dtype=torch.long, device=self.device)
        inputs["input_ids"] = torch.cat([inputs["input_ids"], forced], dim=1)
        if "attention_mask" in inputs:
            inputs["attention_mask"] = torch.cat([inputs["attention_mask"], torch.ones_like(forced)], dim=1)
        if "mm_token_type_ids" in inputs:
            inputs["mm_token_type_ids"] = torch.cat(
                [inputs["mm_token_type_ids"], torch.zeros_like(forced)], 1
            )
        inputs["position_ids"], _ = self.family_spec.positions.prompt(self.model, inputs)
        keep = torch.arange(length - 1, length - 1 + len(answer))  # on the CPU, as in `prefill`
        logits = self.model(**inputs, use_cache=False, logits_to_keep=keep).logits[0]
        return logits.argmax(-1).tolist()

    # -------------------------------------------------------------------------------------- costs
    @torch.inference_mode()
    def measure_tree_cost(
        self,
        sizes: Sequence[int] = COST_SIZES,
        context: int = 256,
        repeats: int = 3,
        clock: Callable[[], float] = time.perf_counter,
    ) -> list[tuple[int, float]]:
        """Median seconds of one tree pass of T tokens (a chain) over a ``context``-token cache, per T.

        ``clock``: wall-clock time by default; `time.thread_time` counts this thread's CPU time only,
        which other processes' load does not inflate (right for one torch thread on a CPU)."""
        from recap.models.kv_cache import GrowingCache

        generator = torch.Generator().manual_seed(0)
        prompt = torch.randint(0, self.vocab_size, (1, context), generator=generator).to(self.device)
        state = RequestState(cache=GrowingCache(), cached=0, input_ids=[])
        self.model(input_ids=prompt, cache=state.cache, use_cache=True, logits_to_keep=1)
        state.cached, points = context, []
        for size in sizes:
            tree = DraftTree()
            parent = -1
            for token in range(1, size):
                parent = tree.add(token % self.vocab_size, parent)
            times = []
            for _ in range(repeats + 1):
                start = clock()
                self.forward_tree(state, [0], tree)
                if self.device.type == "cuda":
                    torch.cuda.synchronize()
                times.append(clock() - start)
                state.cache.crop(-size)
                state.cached = context
            points.append((int(size), float(np.median(times[1:]))))
        log.info("tree cost (T, seconds): %s", points)
        return points


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
