"""Gallery encoding: lazy model build, batched fetch, progress lines (the loader processes and
the cache: tests/integration/test_audit_encoding.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

from audit.runs.progress_lines import encoding_stage
from config.worker_tuning import loader_workers
from retrieval.encoders import LazyRetriever, build_retriever, load_image

TINY = "openclip:cirval-tiny-vit"


def _images(folder: Path, n: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        p = folder / f"im{i}.png"
        Image.new("RGB", (40 + i, 32), (30 * i % 255, 80, 200 - 10 * i)).save(p)
        paths.append(p)
    return paths


@pytest.mark.parametrize("spec", [TINY, "openclip:cirval-tiny-vit-b", TINY + "@random:3"])
def test_lazy_retriever_knows_spec_and_dim_without_building(spec: str) -> None:
    lazy = LazyRetriever(spec, device="cpu")
    real = build_retriever(spec, device="cpu")
    assert (lazy.spec, lazy.dim) == (real.spec, real.dim)
    a, b = torch.randn(3, real.dim), torch.randn(3, real.dim)
    assert torch.equal(lazy.compose(a, b), real.compose(a, b))
    assert not lazy.is_built
    assert torch.equal(lazy.embed_texts(["a red car"]), real.embed_texts(["a red car"]))
    assert lazy.is_built


def test_encoding_stage_line() -> None:
    assert encoding_stage(0, 5000, 0.0) == "encoding gallery: 0/5,000 images"
    assert encoding_stage(1234, 5000, 210.0) == "encoding gallery: 1,234/5,000 images · 210 images/s · ETA 18 s"
    assert encoding_stage(0, 123_403, 100.0).endswith("ETA 20 min 34 s")
    assert encoding_stage(0, 1_000_000, 50.0).endswith("ETA 5 h 33 min")


def test_loader_workers_from_the_cores_left() -> None:
    assert loader_workers(cpus=2, reserved=1, processes=1) == 0  # one core left: decode in-process
    assert loader_workers(cpus=16, reserved=0, processes=1) == 8  # capped
    assert loader_workers(cpus=8, reserved=1, processes=2) == 2  # 7 // 2 = 3 threads, one runs the model


def test_batched_fetch_gives_the_per_file_items(tmp_path: Path) -> None:
    """A loader batch (``__getitems__``: decode every file once, then each pipeline's steps over
    the batch) yields, per pipeline, exactly the tensor or reason of that pipeline run on each
    file alone, also when a file is unreadable or fails a step of one pipeline only."""
    from torchvision.transforms import Compose

    from retrieval.encoders import IMAGE_ERRORS, _collate, _ImageFiles, preprocess_each

    r, rb = build_retriever(TINY, device="cpu"), build_retriever("openclip:cirval-tiny-vit-b", device="cpu")
    paths = _images(tmp_path, 5)
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"not an image")
    items = [(f"k{i}", p) for i, p in enumerate(paths)] + [("bad", bad)]

    def refuse_width_42(im):
        if im.width == 42:
            raise ValueError("width 42 refused")
        return im

    pipelines = [r.preprocess, Compose([refuse_width_42, *r.preprocess.transforms]), rb.preprocess]

    def alone(preprocess, path):
        try:
            return preprocess(load_image(path))
        except IMAGE_ERRORS as exc:
            return f"{type(exc).__name__}: {exc}"

    batch = _ImageFiles(items, pipelines, max_pixels=10**8).__getitems__(list(range(len(items))))
    assert [key for key, _, _ in batch] == [key for key, _ in items]
    for (_, pixels, reasons), (_, path) in zip(batch, items):
        for j, preprocess in enumerate(pipelines):
            want = alone(preprocess, path)
            if isinstance(want, str):
                assert pixels[j] is None and reasons[j] == want
            else:
                assert reasons[j] is None and torch.equal(pixels[j], want)
    assert batch[2][2] == [None, "ValueError: width 42 refused", None]
    assert batch[5][2][0].startswith("UnidentifiedImageError") and batch[5][2][0] == batch[5][2][2]
    keys, stacked, unreadable = _collate(batch)
    assert keys == [key for key, _ in items]
    assert [set(u) for u in unreadable] == [{"bad"}, {"bad", "k2"}, {"bad"}]
    assert [x.shape[0] for x in stacked] == [5, 4, 5]
    images = [load_image(p) for p in paths]
    assert all(torch.equal(a, r.preprocess(im)) for a, im in zip(preprocess_each(r.preprocess, images), images))
