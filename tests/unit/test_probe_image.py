"""retrieval.imagefiles.probe_image: hash and header from one read of the file."""

from __future__ import annotations

import builtins
import hashlib
import io
import struct
from pathlib import Path

import pytest
from PIL import Image

from retrieval import imagefiles
from retrieval.imagefiles import HEADER_BYTES, probe_image


def _opens(monkeypatch, path: Path) -> list[str]:
    """Every open() of ``path`` from now on (this module's, Pillow's)."""
    seen: list[str] = []
    real = builtins.open

    def counting(file, *args, **kwargs):
        if str(file) == str(path):
            seen.append(str(file))
        return real(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting)
    return seen


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_hash_and_size_from_one_read(tmp_path, monkeypatch, fmt):
    path = tmp_path / f"a.{fmt.lower()}"
    Image.new("RGB", (37, 21), (200, 10, 10)).save(path, fmt)
    opens = _opens(monkeypatch, path)
    probe = probe_image(path, max_pixels=10_000)
    assert (probe.exists, probe.width, probe.height, probe.problem) == (True, 37, 21, "")
    assert probe.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert len(opens) == 1  # hashed and its header parsed from the same read


def _jpeg_with_big_metadata(path: Path, size: tuple[int, int]) -> None:
    """A JPEG whose frame header comes after more than HEADER_BYTES of APP segments."""
    buf = io.BytesIO()
    Image.new("RGB", size, (0, 90, 0)).save(buf, "JPEG")
    data = buf.getvalue()
    segment = b"\xff\xe9" + struct.pack(">H", 65535) + b"\0" * 65533  # an APP9 segment: readers skip it
    path.write_bytes(data[:2] + segment * (HEADER_BYTES // len(segment) + 2) + data[2:])


def test_a_header_beyond_the_kept_bytes_is_read_from_the_file(tmp_path):
    path = tmp_path / "meta.jpg"
    _jpeg_with_big_metadata(path, (50, 30))
    assert path.stat().st_size > HEADER_BYTES
    probe = probe_image(path)
    assert (probe.exists, probe.width, probe.height) == (True, 50, 30)
    assert probe.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_broken_missing_and_too_large_files_say_why(tmp_path):
    broken = tmp_path / "x.png"
    broken.write_bytes(b"not an image at all")
    probe = probe_image(broken)
    assert not probe.exists and probe.problem.startswith("not a readable image")
    assert probe.sha256 == hashlib.sha256(b"not an image at all").hexdigest()
    assert probe_image(tmp_path / "none.png").problem == "no such file"
    big = tmp_path / "big.png"
    Image.new("L", (200, 100)).save(big)
    probe = probe_image(big, max_pixels=19_999)
    assert not probe.exists and (probe.width, probe.height) == (200, 100) and "exceeds the limit" in probe.problem
    assert imagefiles.probe_image(big, max_pixels=20_000).exists
