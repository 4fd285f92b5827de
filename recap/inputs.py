"""Validation of user inputs (images, prompts, generation limits), shared by the CLI, studio and bench.

Every check raises ``ValueError`` with a message meant for the person who typed the input.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from pathlib import Path

from PIL import Image, UnidentifiedImageError

log = logging.getLogger(__name__)

#: Images above this many pixels are downscaled (keeping aspect) before the processor sees them.
MAX_IMAGE_PIXELS = 1024 * 1024
#: Images above this many pixels are refused before decoding (64 MP of RGB is ~200 MB once decoded).
MAX_SOURCE_PIXELS = 64 * MAX_IMAGE_PIXELS
#: Files above this size are refused before decoding (a decompression bomb guard).
MAX_IMAGE_BYTES = 50 * 1024 * 1024
#: Formats read from files. Pillow's other decoders are not offered (EPS, for one, runs Ghostscript).
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
#: Longest prompt accepted (Spec-Bench's longest first turn, a summarization article, has 6847).
MAX_PROMPT_CHARS = 8000
MAX_NEW_TOKENS_LIMIT = 4096


def image_size(path: str | Path) -> tuple[int, int]:
    """``(width, height)`` of the image file at ``path``, read from its header only.

    Raises ``ValueError`` (a message without the path: callers add it where the reader may see it)
    when the file is missing, over `MAX_IMAGE_BYTES`, not an image in `IMAGE_FORMATS`, or over
    `MAX_SOURCE_PIXELS` pixels (a decompression bomb included).
    """
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError:
        raise ValueError("image file not found") from None
    if not path.is_file():
        raise ValueError("image file not found (that is not a file)")
    if size > MAX_IMAGE_BYTES:
        raise ValueError(
            f"image file is too large ({size >> 20} MiB; the limit is {MAX_IMAGE_BYTES >> 20} MiB)"
        )
    try:
        with Image.open(path, formats=IMAGE_FORMATS) as opened:
            width, height = opened.size
    except Image.DecompressionBombError as bomb:
        # Pillow refuses to open a far larger image (a decompression bomb); its message has the size
        pixels = re.search(r"Image size \((\d+) pixels\)", str(bomb))
        size = f"{int(pixels[1]) / 1e6:.0f}" if pixels else f"over {2 * Image.MAX_IMAGE_PIXELS / 1e6:.0f}"
        raise ValueError(_too_many_pixels(size)) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        raise ValueError(f"not a readable image (use {', '.join(IMAGE_FORMATS)})") from None
    if width < 1 or height < 1:
        raise ValueError("image is empty (0 pixels)")
    if width * height > MAX_SOURCE_PIXELS:
        raise ValueError(_too_many_pixels(f"{width}x{height} pixels, {width * height / 1e6:.0f}"))
    return width, height


def _too_many_pixels(size: str) -> str:
    return (
        f"image is too large ({size} megapixels; the limit is {MAX_SOURCE_PIXELS / 1e6:.0f} megapixels): "
        "resize it first"
    )


def load_image(source: str | Path | Image.Image, max_pixels: int = MAX_IMAGE_PIXELS) -> Image.Image:
    """Open ``source`` as an RGB image, downscaled to at most ``max_pixels`` pixels.

    A file is checked with `image_size` before it is decoded; every refusal is a ``ValueError`` whose
    message does not contain the path.
    """
    if isinstance(source, Image.Image):
        image = source
    else:
        image_size(source)
        try:
            with Image.open(source, formats=IMAGE_FORMATS) as opened:
                opened.load()
                image = opened.copy()
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError):
            raise ValueError(f"not a readable image (use {', '.join(IMAGE_FORMATS)})") from None
    if image.width < 1 or image.height < 1:
        raise ValueError("image is empty (0 pixels)")
    try:
        image = image.convert("RGB")
    except (OSError, ValueError):
        raise ValueError(f"not a readable image (mode {image.mode} has no RGB conversion)") from None
    if image.width * image.height > max_pixels:
        scale = (max_pixels / (image.width * image.height)) ** 0.5
        size = (max(1, int(image.width * scale)), max(1, int(image.height * scale)))
        log.info("downscaling image from %dx%d to %dx%d", image.width, image.height, *size)
        image = image.resize(size, Image.Resampling.BICUBIC)
    return image


def check_prompt(prompt: str | None, max_chars: int = MAX_PROMPT_CHARS) -> str:
    """Return the prompt exactly as given (a trailing newline changes the model's answer, so nothing
    is stripped); raise if it is empty, whitespace only, longer than ``max_chars`` (`MAX_PROMPT_CHARS`,
    8000: the bound of the CLI, the studio and the benchmark alike) or not valid Unicode."""
    text = prompt if isinstance(prompt, str) else ""
    if not text.strip():
        raise ValueError("the prompt is empty: type a question or instruction")
    if len(text) > max_chars:
        raise ValueError(f"the prompt is too long ({len(text)} characters; limit {max_chars})")
    check_unicode("the prompt", text)
    return text


def check_unicode(name: str, text: str) -> str:
    """``text`` if it is valid Unicode (a JSON request can carry a lone surrogate such as ``"\\ud800"``,
    which no tokenizer or UTF-8 writer accepts); else a ``ValueError`` naming its position."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(
            f"{name} is not valid Unicode text (a lone surrogate at character {error.start + 1}): "
            "retype it or paste it again"
        ) from None
    return text


def check_max_new_tokens(value: int) -> int:
    """Return ``value`` if it is a sensible number of tokens to generate (1..4096)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_NEW_TOKENS_LIMIT:
        raise ValueError(f"max_new_tokens must be an integer from 1 to {MAX_NEW_TOKENS_LIMIT}, got {value!r}")
    return value


# ---------------------------------------------------------------------------------- prompt length
def max_positions(config: object) -> int | None:
    """The most positions ``config`` (a model's text config) embeds: ``max_position_embeddings`` (or
    ``n_positions``); None when it says neither."""
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def check_positions(prompt_tokens: int, max_new_tokens: int, limit: int | None, images: int = 0) -> None:
    """Raise ``ValueError`` when the prompt's tokens (with its ``images``' tokens) and the new tokens
    asked for need more positions than the model has (``limit``; None: unknown, no check): past them
    its position embeddings are garbage, not an answer."""
    if limit is None or prompt_tokens + max_new_tokens <= limit:
        return
    included = " (the image's included)" if images == 1 else " (the images' included)" if images else ""
    room = limit - prompt_tokens
    advice = (
        "shorten the prompt"
        if room < 1
        else f"shorten the prompt or ask for at most {room} new token{'s' if room > 1 else ''}"
    )
    raise ValueError(
        f"the prompt is {prompt_tokens} tokens{included} and {max_new_tokens} new tokens "
        f"were asked for: {prompt_tokens + max_new_tokens} positions, over this model's maximum of "
        f"{limit}: {advice}"
    )


# ------------------------------------------------------------------------- values from a form or an API
# A web API hands over whatever JSON a caller sends (strings, lists, NaN, Infinity, 1e308): these checks
# take any value and either return it in the expected type or raise a ValueError naming the bounds.


def shown(value: object, limit: int = 40) -> str:
    """A short ``repr`` of ``value`` for an error message (long values are cut: they are echoed back)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    if isinstance(value, str):  # cut inside the quotes, so that the closing quote stays
        cut = value[: max(limit - 3, 1)]
        while len(repr(cut + "…")) > limit and len(cut) > 1:
            cut = cut[:-1]
        return repr(cut + "…")
    return text[: limit - 1] + "…"


def check_integer(name: str, value: object, low: int, high: int) -> int:
    """``value`` as an int in ``[low, high]``; ``8.0`` counts, ``True``, ``"8"`` and ``8.5`` don't."""
    given = value  # echoed as sent (1e308, not its 309 digits)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be a whole number from {low} to {high}, got {shown(given)}")
    return value


def check_number(name: str, value: object, low: float, high: float) -> float:
    """``value`` as a finite float in ``[low, high]`` (NaN and infinities are refused)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number from {low:g} to {high:g}, got {shown(value)}")
    number = float(value)
    if not (math.isfinite(number) and low <= number <= high):
        raise ValueError(f"{name} must be a number from {low:g} to {high:g}, got {shown(value)}")
    return number


def check_choice(name: str, value: object, choices: Sequence[str]) -> str:
    """``value`` if it is one of ``choices`` (exactly, as a string)."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {shown(value)}")
    return value


def check_flag(name: str, value: object) -> bool:
    """``value`` if it is a boolean (``"yes"``, ``1`` and ``None`` are not)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {shown(value)}")
    return value
