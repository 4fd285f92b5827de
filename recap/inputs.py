"""Validation of user inputs (images, prompts, generation limits), shared by the CLI, studio and bench.

Every check raises ``ValueError`` with a message meant for the person who typed the input.
"""

from __future__ import annotations

import logging
from pathlib import Path

from PIL import Image, UnidentifiedImageError

log = logging.getLogger(__name__)

#: Images above this many pixels are downscaled (keeping aspect) before the processor sees them.
MAX_IMAGE_PIXELS = 1024 * 1024
#: Files above this size are refused before decoding (a decompression bomb guard).
MAX_IMAGE_BYTES = 50 * 1024 * 1024
#: Longest prompt accepted (Spec-Bench's longest first turn, a summarization article, has 6847).
MAX_PROMPT_CHARS = 8000
MAX_NEW_TOKENS_LIMIT = 4096


def load_image(source: str | Path | Image.Image, max_pixels: int = MAX_IMAGE_PIXELS) -> Image.Image:
    """Open ``source`` as an RGB image, downscaled to at most ``max_pixels`` pixels."""
    if isinstance(source, Image.Image):
        image = source
    else:
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"image file not found: {path}")
        if path.stat().st_size > MAX_IMAGE_BYTES:
            raise ValueError(
                f"image file is too large ({path.stat().st_size >> 20} MiB; limit 50 MiB): {path}"
            )
        try:
            with Image.open(path) as opened:
                if opened.width * opened.height > 64 * max_pixels:
                    raise ValueError(f"image is too large ({opened.width}x{opened.height} pixels): {path}")
                opened.load()
                image = opened.copy()
        except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as error:
            raise ValueError(f"not a readable image: {path} ({type(error).__name__})") from None
    if image.width < 1 or image.height < 1:
        raise ValueError("image is empty (0 pixels)")
    image = image.convert("RGB")
    if image.width * image.height > max_pixels:
        scale = (max_pixels / (image.width * image.height)) ** 0.5
        size = (max(1, int(image.width * scale)), max(1, int(image.height * scale)))
        log.info("downscaling image from %dx%d to %dx%d", image.width, image.height, *size)
        image = image.resize(size, Image.Resampling.BICUBIC)
    return image


def check_prompt(prompt: str | None, max_chars: int = MAX_PROMPT_CHARS) -> str:
    """Return the stripped prompt, or raise if it is empty or longer than ``max_chars``."""
    text = (prompt or "").strip()
    if not text:
        raise ValueError("the prompt is empty: type a question or instruction")
    if len(text) > max_chars:
        raise ValueError(f"the prompt is too long ({len(text)} characters; limit {max_chars})")
    return text


def check_max_new_tokens(value: int) -> int:
    """Return ``value`` if it is a sensible number of tokens to generate (1..4096)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_NEW_TOKENS_LIMIT:
        raise ValueError(f"max_new_tokens must be an integer from 1 to {MAX_NEW_TOKENS_LIMIT}, got {value!r}")
    return value
