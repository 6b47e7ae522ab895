"""The fixed file names of a release and how its files are listed and hashed."""

from __future__ import annotations

from pathlib import Path

from retrieval.imagefiles import sha256_file

SUMS = "SHA256SUMS"
RELEASE_JSON = "release.json"
#: The one field of a release that changes when the same study is released again (in release.json).
TIMESTAMP_FIELD = "released_at"


def release_files(root: Path) -> list[str]:
    """Every file under ``root``, relative POSIX paths, sorted."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def file_sums(root: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """sha256 of every file under ``root`` but ``skip``, by relative path."""
    return {name: sha256_file(root / name) for name in release_files(root) if name not in skip}
