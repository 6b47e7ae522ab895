"""Image files on disk: safe path resolution under a root, probing, hashing.

Pure Python + Pillow (no Django): the loader and the image views call these with the
roots from settings.
"""

from __future__ import annotations

import hashlib
import io
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from PIL import Image as PILImage

from config.defaults import MAX_PIXELS

#: The largest image read by default (:data:`config.defaults.MAX_PIXELS`; ``IMAGE_MAX_PIXELS``
#: in the settings overrides it); the pure readers take it as their default.
DEFAULT_MAX_PIXELS = MAX_PIXELS


class PathEscapeError(ValueError):
    """A path that leaves its allowed root (``..``, an absolute path, a symlink out)."""


@lru_cache(maxsize=64)
def _resolved_root(root: str) -> Path:
    """An images root with its symlinks resolved, once per process and root (an audit
    resolves hundreds of thousands of files under the same few roots)."""
    return Path(root).resolve()


def resolve_under(root: Path, rel: str) -> Path:
    """Join ``rel`` to ``root`` and resolve symlinks; refuse anything outside ``root``."""
    root = _resolved_root(str(root))
    if not rel or rel.startswith("/") or "\x00" in rel:
        raise PathEscapeError(f"{rel!r} is not a relative path")
    full = (root / rel).resolve()
    if full != root and root not in full.parents:
        raise PathEscapeError(f"{rel!r} resolves to {full}, outside {root}")
    return full


class UnderRoot:
    """:func:`resolve_under` for many files under one root, the same answers for less work:
    each folder is resolved once (the files of a gallery share a few folders), then a file
    costs one ``lstat`` (a file that is a symlink is resolved in full, and checked).

    Keep one for one batch of files (an audit chunk): a folder replaced by a symlink after
    it was resolved is seen by the next batch, as with any check made before the open.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._folders: dict[str, str] = {}

    def __call__(self, rel: str) -> Path:
        if not rel or rel.startswith("/") or "\x00" in rel:
            raise PathEscapeError(f"{rel!r} is not a relative path")
        folder, _, name = rel.rpartition("/")
        if name in ("", ".", ".."):
            return resolve_under(self.root, rel)
        base = self._folders.get(folder)
        if base is None:
            base = str(resolve_under(self.root, folder) if folder else _resolved_root(str(self.root)))
            self._folders[folder] = base
        full = os.path.join(base, name)
        if os.path.islink(full):
            return resolve_under(self.root, rel)
        return Path(full)


def within_any(path: Path, roots: list[Path]) -> bool:
    """Whether the resolved ``path`` lies inside one of ``roots``."""
    real = Path(path).resolve()
    for root in roots:
        root = Path(root).resolve()
        if real == root or root in real.parents:
            return True
    return False


@dataclass
class ImageProbe:
    exists: bool
    sha256: str = ""
    width: int | None = None
    height: int | None = None
    problem: str = ""


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


#: Bytes of a file kept while it is hashed, for Pillow to read the header from (an image's
#: header lies in its first kilobytes; a JPEG's metadata segments before its frame header are
#: at most a few hundred kilobytes in practice).
HEADER_BYTES = 1 << 20


def _hash_keeping_head(path: Path, chunk: int = 1 << 20) -> tuple[str, bytes]:
    """The file's sha256 and its first :data:`HEADER_BYTES` bytes, from one read of it."""
    digest = hashlib.sha256()
    head = bytearray()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
            if len(head) < HEADER_BYTES:
                head += block[: HEADER_BYTES - len(head)]
    return digest.hexdigest(), bytes(head)


def _image_size(path: Path, head: bytes) -> tuple[int, int]:
    """Width and height from the header in ``head``; the file itself is opened only when the
    header does not end within it (or the file is broken, to say why)."""
    try:
        with PILImage.open(io.BytesIO(head)) as img:
            return img.size
    except PILImage.DecompressionBombError:
        raise
    except Exception:  # header longer than HEADER_BYTES, or a broken file: ask the file itself
        with PILImage.open(path) as img:
            return img.size


def probe_image(path: Path, max_pixels: int | None = None) -> ImageProbe:
    """Hash a file and read its size from the header (the pixels are not decoded), from one
    read of the file: the header is parsed from the bytes the hash read.

    An image with more than ``max_pixels`` pixels counts as unusable (a decompression
    bomb): it is reported, never decoded."""
    try:
        if not path.is_file():
            return ImageProbe(exists=False, problem="no such file")
        digest, head = _hash_keeping_head(path)
    except OSError as exc:
        return ImageProbe(exists=False, problem=f"unreadable: {exc.strerror or exc}")
    try:
        width, height = _image_size(path, head)
    except PILImage.DecompressionBombError as exc:
        return ImageProbe(exists=False, sha256=digest, problem=f"exceeds the limit (decompression bomb): {exc}")
    except Exception as exc:  # Pillow raises many types for broken files
        return ImageProbe(exists=False, sha256=digest, problem=f"not a readable image: {exc}")
    if max_pixels is not None and width * height > max_pixels:
        return ImageProbe(
            exists=False,
            sha256=digest,
            width=width,
            height=height,
            problem=f"{width}x{height} pixels exceeds the limit of {max_pixels}",
        )
    return ImageProbe(exists=True, sha256=digest, width=width, height=height)
