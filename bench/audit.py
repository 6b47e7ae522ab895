"""Usage: python bench/audit.py [--device auto|cpu|cuda] [--n-gallery N] [--n-single N]
[--n-sessions N] [--retriever SPEC ...] [--naive-queries N] [--keep DIR]

Timing of the shortcut audit on the demo world (retrieval.demo.build_demo, loaded into a
throw-away SQLite database under a temporary CIRVAL_VAR_DIR), with the two tiny
random-weight retrievers by default. Prints figures; asserts nothing.

1. encode once: every gallery image, every query's reference image and text, per
   retriever, batched (the floor any audit must pay);
2. full audit, cold cache: the real in-process audit (plan, chunks, three modalities,
   labels, subsets); target: at most 1.3x the encode time;
3. the same audit again, warm embedding cache; target: at least 10x faster than (2);
4. the naive way: each query encoded separately for each modality (image and text for
   the multimodal query, then the text alone, then the image alone, batch size 1) and a
   full argsort of the gallery per query and modality (retrieval.ranking.naive_rank).

Queries/second counts audited queries times retrievers (one query = its three
modalities). Runs on CUDA when available (--device auto), or where --device says.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_SPECS = ["openclip:cirval-tiny-vit", "openclip:cirval-tiny-vit-b"]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto", help="auto (cuda when available), cpu, cuda, cuda:1 ...")
    p.add_argument("--n-gallery", type=int, default=420)
    p.add_argument("--n-single", type=int, default=160)
    # The figures compare like with like: "encode once" covers the single-turn queries, so
    # the demo's sessions (turn-wise ranking, 9 rankings per turn) are left out unless asked.
    p.add_argument("--n-sessions", type=int, default=0, help="demo sessions to add (default 0: single-turn only)")
    p.add_argument("--retriever", action="append", dest="retrievers", default=None)
    p.add_argument("--naive-queries", type=int, default=None, help="Queries for the naive way (default: all).")
    p.add_argument("--keep", default=None, help="Work in this folder and keep it (default: a temporary one).")
    return p.parse_args()


def setup_django(work: Path, device: str) -> None:
    os.environ["CIRVAL_VAR_DIR"] = str(work / "var")
    os.environ["DATABASE_URL"] = f"sqlite:///{work / 'var' / 'bench.sqlite3'}"
    os.environ["CELERY_BROKER_URL"] = "filesystem://"
    os.environ["EMBEDDING_CACHE_DIR"] = str(work / "embeddings")
    os.environ["AUDIT_DEVICE"] = "" if device == "auto" else device
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def line(name: str, seconds: float, n_queries: int, note: str = "") -> None:
    qps = n_queries / seconds if seconds > 0 else float("inf")
    print(f"  {name:<38}{seconds:>9.3f} s {qps:>11.1f} q/s  {note}")


def main() -> None:
    args = parse_args()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="cirval-bench-audit-"))
    work.mkdir(parents=True, exist_ok=True)
    setup_django(work, args.device)

    import logging

    logging.getLogger().setLevel(logging.WARNING)
    import torch
    from django.conf import settings

    from audit.runs import dispatch, planning
    from audit.engine import clear_memos, get_retriever
    from audit.models import AuditRank
    from retrieval.demo import build_demo
    from retrieval.encoders import load_image
    from retrieval.evaltargets import positive_image_ids
    from retrieval.loader import load_parsed
    from retrieval.models import Dataset, GalleryEntry, Image, Turn
    from retrieval.ranking import naive_rank

    specs = args.retrievers or DEFAULT_SPECS
    device = settings.AUDIT_DEVICE or ("cuda" if torch.cuda.is_available() else "cpu")
    print(f"CIRVal audit benchmark · python {platform.python_version()} · torch {torch.__version__} · "
          f"device {device}{' (' + torch.cuda.get_device_name(0) + ')' if device.startswith('cuda') else ''}"
          f" · {torch.get_num_threads()} CPU threads")

    t0 = time.perf_counter()
    demo_dir = work / "demo"
    parsed = build_demo(demo_dir, n_gallery=args.n_gallery, n_single=args.n_single, n_sessions=args.n_sessions)
    load_parsed(parsed, "demo", images_root=demo_dir)
    dataset = Dataset.objects.get(name="demo")
    print(f"demo world: {len(parsed.images)} images, {args.n_single} single-turn queries, "
          f"{args.n_sessions} sessions (built and loaded in {time.perf_counter() - t0:.1f} s); "
          f"retrievers: {', '.join(specs)}")

    # Build (and warm up) the retrievers once; the audit reuses the same instances.
    t0 = time.perf_counter()
    retrievers = [get_retriever(s, device=settings.AUDIT_DEVICE or None) for s in specs]
    probe = load_image(demo_dir / next(iter(parsed.images.values())).path)
    for r in retrievers:
        r.embed_images([probe])
        r.embed_texts(["warm up"])
    print(f"model build + warm-up: {time.perf_counter() - t0:.2f} s (not counted below)")

    gallery_ids = list(GalleryEntry.objects.filter(dataset=dataset, split="val").order_by("ordinal")
                       .values_list("image_id", flat=True))
    images = Image.objects.in_bulk(gallery_ids)
    index = {pk: n for n, pk in enumerate(gallery_ids)}
    turns = list(Turn.objects.filter(query__dataset=dataset, query__n_turns=1, index=1)
                 .select_related("reference_image").order_by("query__ordinal"))
    n_q = len(turns)
    positives_of = {q: [index[i] for i in ids if i in index]
                    for q, ids in positive_image_ids(dataset.format, [t.query_id for t in turns]).items()}
    pool = n_q * len(specs)

    # 1. encode once -----------------------------------------------------------------
    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    t0 = time.perf_counter()
    for r in retrievers:
        r.embed_images([load_image(demo_dir / images[i].path) for i in gallery_ids])
        r.embed_images([load_image(demo_dir / t.reference_image.path) for t in turns])
        r.embed_texts([t.text for t in turns])
    sync()
    encode_s = time.perf_counter() - t0

    # 2. full audit, cold cache ------------------------------------------------------------
    shutil.rmtree(settings.EMBEDDING_CACHE_DIR, ignore_errors=True)
    t0 = time.perf_counter()
    cold = dispatch.run_inline(planning.create_run(dataset, specs))
    sync()
    cold_s = time.perf_counter() - t0
    assert cold.status == "done", cold.error

    # 3. repeat, warm cache ----------------------------------------------------------------
    t0 = time.perf_counter()
    warm = dispatch.run_inline(planning.create_run(dataset, specs))
    sync()
    warm_s = time.perf_counter() - t0

    # 4. the naive way ---------------------------------------------------------------------
    n_naive = min(args.naive_queries or n_q, n_q)
    t0 = time.perf_counter()
    naive_ranks: dict[tuple[int, str], tuple] = {}
    for spec, r in zip(specs, retrievers):
        gallery = r.embed_images([load_image(demo_dir / images[i].path) for i in gallery_ids]).to(r.device)
        for t in turns[:n_naive]:
            pos = [positives_of.get(t.query_id, [])]
            ex = [index.get(t.reference_image_id)]
            ref = demo_dir / t.reference_image.path
            mm = r.compose(r.embed_images([load_image(ref)]), r.embed_texts([t.text])).to(r.device)
            txt = r.embed_texts([t.text]).to(r.device)
            img = r.embed_images([load_image(ref)]).to(r.device)
            naive_ranks[(t.query_id, spec)] = tuple(
                naive_rank(e, gallery, pos, ex, top_k=10 if n == 0 else 0).best_rank[0]
                for n, e in enumerate((mm, txt, img))
            )
    sync()
    naive_s = time.perf_counter() - t0
    audit_ranks = {(q, s): (a, b, c) for q, s, a, b, c in AuditRank.objects.filter(run=cold).values_list(
        "query_id", "retriever", "mm", "text", "image")}
    agree = sum(1 for key, v in naive_ranks.items() if audit_ranks.get(key) == v)

    print(f"\n{n_q} single-turn queries x {len(specs)} retrievers = {pool} (query, retriever) pairs, "
          f"{len(gallery_ids)} gallery images; wall-clock seconds")
    line("encode gallery + queries once", encode_s, pool)
    line("full audit, cold cache", cold_s, pool, f"= {cold_s / encode_s:.2f}x encode (target <= 1.3x)")
    line("repeat audit, warm cache", warm_s, pool, f"= {cold_s / warm_s:.1f}x faster than cold (target >= 10x)")
    line(f"naive ({n_naive} queries per retriever)", naive_s, n_naive * len(specs),
         f"~ {naive_s / (n_naive * len(specs)) * pool / cold_s:.1f}x the audit's time for all queries")
    t = cold.timings
    print(f"\ncold audit breakdown: encode gallery {t.get('encode_gallery', 0):.3f} s, encode queries "
          f"{t.get('encode_queries', 0):.3f} s, read gallery {t.get('load_gallery', 0):.3f} s, rank+write "
          f"{t.get('rank', 0):.3f} s, aggregate {t.get('aggregate', 0):.3f} s; embeddings encoded "
          f"{t['cache'].get('encoded', 0)}")
    w = warm.timings
    print(f"warm audit: embeddings encoded {w['cache'].get('encoded', 0)}, cache hits "
          f"{w['cache'].get('gallery_hits', 0) + w['cache'].get('query_image_hits', 0) + w['cache'].get('text_hits', 0)}")
    print(f"labels: {cold.summary['counts']}; naive and audit ranks agree on {agree}/{len(naive_ranks)} pairs")
    clear_memos()
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
