"""Usage: python bench/circo_gallery.py [--images 123403] [--retriever SPEC] [--device auto|cpu|cuda]
[--chunk-gallery 4096] [--loader-workers N] [--keep DIR]

A CIRCO val audit over a COCO-sized gallery, end to end through the product: CIRCO's real
``val.json`` (220 queries, ../shared/reference/datasets/circo) imported with
``import_dataset``, a gallery of ``--images`` generated 16x16 JPEG files (named ``%012d.jpg``
like COCO unlabeled2017; the 1,121 annotation images among them) added with
``import_gallery --folder``, then the in-process audit (``run_audit --eager``'s path) with a
tiny open_clip retriever, and the protocol report (mAP@K, Recall@K of ``target_img_id``).
Throw-away SQLite database and embedding cache under a temporary folder.

Prints, per stage (generate, import, gallery import, audit, protocol report): wall seconds,
images/s, and the peak anonymous RSS of this process (sampled every 20 ms from
/proc/self/status; the image loader processes of the audit are not included) and the peak
file-backed RSS (the memory-mapped gallery matrix: page cache, evictable). Run it at two sizes
(e.g. ``--images 20000`` and ``--images 123403``) to see that the anonymous peak stays flat.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from io import StringIO
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.audit_scale import PeakSampler  # noqa: E402

CIRCO_VAL = ROOT.parent / "shared" / "reference" / "datasets" / "circo" / "val.json"
if not CIRCO_VAL.exists():
    CIRCO_VAL = ROOT / "tests" / "fixtures" / "datasets" / "circo" / "val.json"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=123_403, help="gallery size (CIRCO's: 123,403)")
    p.add_argument("--retriever", default="openclip:cirval-tiny-vit")
    p.add_argument("--device", default="auto")
    p.add_argument("--chunk-gallery", type=int, default=4096)
    p.add_argument("--loader-workers", type=int, default=None)
    p.add_argument("--keep", default=None, help="work in this folder and keep it (default: a temporary one)")
    return p.parse_args()


def setup_django(work: Path, args: argparse.Namespace) -> None:
    os.environ["CIRVAL_VAR_DIR"] = str(work / "var")
    os.environ["DATABASE_URL"] = f"sqlite:///{work / 'var' / 'bench.sqlite3'}"
    os.environ["CELERY_BROKER_URL"] = "filesystem://"
    os.environ["EMBEDDING_CACHE_DIR"] = str(work / "embeddings")
    os.environ["AUDIT_DEVICE"] = "" if args.device == "auto" else args.device
    if args.loader_workers is not None:
        os.environ["AUDIT_LOADER_WORKERS"] = str(args.loader_workers)
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def generate(folder: Path, n: int, annotated: set[int]) -> int:
    """``n`` tiny JPEGs named like COCO images: the annotated ids first, then filler ids."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    ids = sorted(annotated)[:n]
    filler = 1
    while len(ids) < n:
        if filler not in annotated:
            ids.append(filler)
        filler += 1
    rng = np.random.default_rng(0)
    for coco in ids:
        pixels = rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{coco:012d}.jpg", quality=80)
    return len(ids)


def stage(name: str, results: list, fn, items: int | None = None):
    with PeakSampler() as peak:
        t0 = time.perf_counter()
        out = fn()
        seconds = time.perf_counter() - t0
    rate = f", {items / seconds:,.0f} images/s" if items else ""
    print(
        f"{name:<16} {seconds:9.1f} s{rate}; peak RSS anon {peak.anon / 1024:,.0f} MiB, "
        f"file {peak.file / 1024:,.0f} MiB",
        flush=True,
    )
    results.append(
        {"stage": name, "seconds": seconds, "peak_anon_mib": peak.anon / 1024, "peak_file_mib": peak.file / 1024}
    )
    return out


def main() -> None:
    args = parse_args()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="cirval-circo-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        run(args, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, work: Path) -> None:
    setup_django(work, args)
    from django.core.management import call_command

    from audit.protocol import run_protocol
    from audit.runs import dispatch, planning

    val = json.loads(CIRCO_VAL.read_text())
    annotated = {r["reference_img_id"] for r in val} | {g for r in val for g in r["gt_img_ids"]}
    images = work / "unlabeled2017"
    results: list = []
    print(
        f"CIRCO val: {len(val)} queries, {len(annotated)} annotation images; gallery {args.images:,} images; "
        f"{args.retriever} on {args.device}",
        flush=True,
    )
    n = stage("generate", results, lambda: generate(images, args.images, annotated), args.images)
    stage(
        "import_dataset",
        results,
        lambda: call_command(
            "import_dataset",
            "--format",
            "circo",
            "--name",
            "circo-val",
            "--images-root",
            str(images),
            str(CIRCO_VAL),
            stdout=StringIO(),
        ),
    )
    stage(
        "import_gallery",
        results,
        lambda: call_command(
            "import_gallery",
            "--dataset",
            "circo-val",
            "--split",
            "val",
            "--folder",
            str(images),
            "--format",
            "json",
            stdout=StringIO(),
        ),
        n,
    )
    run_ = stage(
        "audit",
        results,
        lambda: dispatch.run_inline(
            planning.create_run("circo-val", [args.retriever], chunk_gallery=args.chunk_gallery)
        ),
        n,
    )
    if run_.status != "done":
        print(f"audit failed: {run_.error}")
        return
    report = stage("protocol report", results, lambda: run_protocol(run_))
    print(f"gallery searched: {run_.summary['plan']['gallery']}")
    row = next(r for r in report["rows"] if r["modality"] == "multimodal")
    print("multimodal: " + ", ".join(f"{k} {100 * v:.2f}" for k, v in row.items() if isinstance(v, float)) + " (%)")
    print("warnings: " + ("; ".join(report["warnings"]) or "none"))
    print(json.dumps({"images": n, "stages": results}))


if __name__ == "__main__":
    main()
