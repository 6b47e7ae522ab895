"""Serving image files: only from IMAGE_ROOTS, thumbnails cached, bombs refused.

Within budget (issue 29):

* a full-size image is served only once it has been **verified** (:func:`verified`): a PNG's
  chunks and checksums read to the end (``Image.verify``), any other format decoded (a JPEG
  at the smallest scale its decoder offers, which still reads the whole stream); a truncated
  or corrupt file is refused (422). The result is remembered beside the thumbnails, keyed
  by path, size and modification time, so each file is checked once;
* the thumbnails of one image are built **one at a time** (an exclusive ``flock`` per image,
  held across processes), all sizes from one decode, so five sizes requested together
  decode the image once, not five times in parallel (2.2 GB for a 7,900x7,900 image);
* a decode whose pixels would take more than ``IMAGE_DECODE_MAX_BYTES`` (after the JPEG
  draft reduction) is refused before it starts.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from contextlib import contextmanager
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


def _key(path: Path, what: str) -> str:
    stat = path.stat()
    return hashlib.sha256(f"{path}|{stat.st_mtime_ns}|{stat.st_size}|{what}".encode()).hexdigest()


def _cached(key: str, suffix: str) -> Path:
    return Path(settings.THUMBNAIL_DIR) / key[:2] / f"{key}{suffix}"


@contextmanager
def _one_at_a_time(path: Path):
    """Hold the image's exclusive lock (one decode of one image at a time, across processes)."""
    lock = _cached(_key(path, "lock"), ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _damaged(exc: BaseException) -> ImageRefused:
    return ImageRefused(f"not a readable image ({type(exc).__name__}: the file is damaged or truncated)")


def _check_budget(img, size: int | None) -> None:
    """Refuse a decode whose pixels would pass IMAGE_DECODE_MAX_BYTES (after a JPEG draft)."""
    if size is not None:
        img.draft("RGB", (size, size))
    width, height = img.size
    needed = width * height * max(len(img.getbands()), 3)
    if needed > settings.IMAGE_DECODE_MAX_BYTES:
        raise ImageRefused(
            f"image refused: decoding it needs {needed // 2**20} MB, more than the "
            f"{settings.IMAGE_DECODE_MAX_BYTES // 2**20} MB allowed per image"
        )


def verified(path: Path) -> Path:
    """``path`` once it is known to decode to the end (see the module notes); ImageRefused if not."""
    check_pixels(path)
    mark = _cached(_key(path, "verified"), ".ok")
    if mark.exists():
        return path
    with _one_at_a_time(path):
        if mark.exists():
            return path
        try:
            with PILImage.open(path) as img:
                if img.format == "PNG":
                    img.verify()
                else:
                    _check_budget(img, 64)
                    img.load()
        except ImageRefused:
            raise
        except Exception as exc:  # noqa: BLE001 - the message may carry the path: never shown
            raise _damaged(exc) from None
        mark.parent.mkdir(parents=True, exist_ok=True)
        mark.touch()
    return path


def thumbnail(path: Path, size: int) -> Path:
    """A cached PNG thumbnail of at most ``size`` pixels on its long side. All sizes of one
    image are built together, under its lock, from one decode."""
    check_pixels(path)
    out = _cached(_key(path, str(size)), ".png")
    if out.exists():
        return out
    with _one_at_a_time(path):
        if not out.exists():  # another request may have built it while this one waited
            _build_thumbnails(path)
    return out


def _build_thumbnails(path: Path) -> None:
    largest = max(THUMB_SIZES)
    try:
        with PILImage.open(path) as img:
            _check_budget(img, largest)
            img.load()
            if img.mode != "RGB":
                img = img.convert("RGB")
            for size in sorted(THUMB_SIZES, reverse=True):  # each from the one before: small steps
                img.thumbnail((size, size))
                out = _cached(_key(path, str(size)), ".png")
                out.parent.mkdir(parents=True, exist_ok=True)
                tmp = out.with_suffix(f".{os.getpid()}.tmp")
                try:
                    img.save(tmp, format="PNG", optimize=False)
                except BaseException:
                    tmp.unlink(missing_ok=True)
                    raise
                os.replace(tmp, out)
    except ImageRefused:
        raise
    except (OSError, ValueError, SyntaxError) as exc:  # truncated or corrupt past its header
        raise _damaged(exc) from None


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
