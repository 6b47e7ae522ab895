"""Serving image files: only from IMAGE_ROOTS, thumbnails cached, bombs refused."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from django.conf import settings
from PIL import Image as PILImage

from .imagefiles import PathEscapeError, resolve_under, within_any

THUMB_SIZES = (96, 160, 256, 384, 512)


class ImageRefused(Exception):
    """The file exists but will not be decoded (too many pixels, unreadable)."""


def image_file(dataset_root: str, rel_path: str) -> Path | None:
    """The file behind an Image row, or None when it is outside IMAGE_ROOTS or absent."""
    if not dataset_root or not rel_path:
        return None
    try:
        full = resolve_under(Path(dataset_root), rel_path)
    except PathEscapeError:
        return None
    if not within_any(full, settings.IMAGE_ROOTS) or not full.is_file():
        return None
    return full


def check_pixels(path: Path) -> tuple[int, int]:
    """Read the header only and refuse images above IMAGE_MAX_PIXELS."""
    try:
        with PILImage.open(path) as img:
            width, height = img.size
    except PILImage.DecompressionBombError:
        raise ImageRefused("image refused: too many pixels to decode safely") from None
    except Exception as exc:  # the message may carry the absolute path: never shown
        raise ImageRefused(f"not a readable image ({type(exc).__name__})") from None
    if width * height > settings.IMAGE_MAX_PIXELS:
        raise ImageRefused(
            f"image refused: {width}x{height} = {width * height} pixels exceeds the limit of {settings.IMAGE_MAX_PIXELS}"
        )
    return width, height


def thumbnail(path: Path, size: int) -> Path:
    """A cached JPEG/PNG thumbnail of at most ``size`` pixels on its long side."""
    check_pixels(path)
    stat = path.stat()
    key = hashlib.sha256(f"{path}|{stat.st_mtime_ns}|{stat.st_size}|{size}".encode()).hexdigest()
    out = Path(settings.THUMBNAIL_DIR) / key[:2] / f"{key}.png"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    try:
        with PILImage.open(path) as img:
            img.draft("RGB", (size, size))
            img = img.convert("RGB")
            img.thumbnail((size, size))
            img.save(tmp, format="PNG", optimize=False)
    except (OSError, ValueError, SyntaxError) as exc:  # truncated or corrupt past its header
        tmp.unlink(missing_ok=True)
        raise ImageRefused(f"not a readable image ({type(exc).__name__}: the file is damaged or truncated)") from None
    os.replace(tmp, out)
    return out


def parse_size(raw: str | None) -> int | None:
    """``?size=``: None for the full image, else one of THUMB_SIZES; ValueError otherwise
    (ASCII digits only: ``int("²")`` would raise, ``"²".isdigit()`` is True)."""
    if raw is None or raw == "":
        return None
    if not (raw.isascii() and raw.isdigit()) or int(raw) not in THUMB_SIZES:
        raise ValueError(f"size must be one of {list(THUMB_SIZES)}")
    return int(raw)


def placeholder_svg(label: str, size: int = 256) -> str:
    from django.utils.html import escape

    text = escape(label[:40])
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{size}" height="{size}" viewBox="0 0 256 256">'
        '<rect width="256" height="256" fill="#eceff3"/>'
        '<path d="M88 96h80v64H88z" fill="none" stroke="#9aa5b1" stroke-width="6"/>'
        '<circle cx="110" cy="116" r="8" fill="#9aa5b1"/>'
        '<path d="M92 156l26-26 18 18 12-12 18 20" fill="none" stroke="#9aa5b1" stroke-width="6"/>'
        f'<text x="128" y="196" text-anchor="middle" font-family="sans-serif" font-size="14" fill="#52606d">image missing</text>'
        f'<text x="128" y="216" text-anchor="middle" font-family="monospace" font-size="11" fill="#7b8794">{text}</text>'
        "</svg>"
    )
