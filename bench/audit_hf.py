"""The ``hf:`` figure of bench/audit.py (``python bench/audit.py --hf [--hf-family F]``).

For a tiny random-weight ``hf:`` checkpoint (retrieval.retrievers.hf.tiny: Qwen2-VL, or
Qwen3-VL / LLaVA-NeXT for the families on those), on the demo world: the full audit, cold
cache, as a fresh worker runs it, against the bare forward passes that audit needs, as a fresh
process does them: the retriever built, every gallery image decoded once and embedded as a
candidate, and per query its three early-fusion passes (composed, the family's text-only
query for each distinct text, its image-only query for each distinct reference image),
batched, and nothing else. Goal: audit / bare <= 1.3, as for open_clip. Both include the
model build; the ratio to the passes alone is printed beside it. ``--repeat`` runs,
interleaved; medians with their spread.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from types import ModuleType

BACKBONE = {
    "gme": "qwen2_vl",
    "vlm2vec": "qwen2_vl",
    "lamra": "qwen2_vl",
    "qwen3-vl-embedding": "qwen3_vl",
    "e5-v": "llava_next",
}


def bare_passes(b: ModuleType, spec, demo_dir, images, gallery_ids, index, turns, sync):
    """The minimal early-fusion work, as a fresh process. Returns (the whole, the passes alone,
    the number of forward passes)."""
    from django.conf import settings

    from retrieval.encoders import load_image
    from retrieval.retrievers.pipeline import audit_retriever

    texts = list(dict.fromkeys(t.text for t in turns))
    refs = list(dict.fromkeys(t.reference_image_id for t in turns))
    with b.Clock(sync) as whole:
        r = audit_retriever(
            spec,
            device=settings.AUDIT_DEVICE or None,
            batch_size=settings.AUDIT_BATCH_SIZE,
            precision=settings.AUDIT_PRECISION,
        )
        getattr(r, "built", None)  # a lazy retriever builds its model here, outside the passes' clock
        with b.Clock(sync) as passes:
            gallery = [load_image(demo_dir / images[i].path) for i in gallery_ids]
            outside = {
                i: load_image(demo_dir / t.reference_image.path)
                for t in turns
                for i in [t.reference_image_id]
                if i not in index
            }

            def image_of(pk):
                return gallery[index[pk]] if pk in index else outside[pk]

            r.embed_candidates(gallery)
            r.embed_queries([image_of(t.reference_image_id) for t in turns], [t.text for t in turns])
            r.embed_queries([None] * len(texts), texts)
            r.embed_queries([image_of(pk) for pk in refs], [None] * len(refs))
    return whole, passes, len(gallery_ids) + len(turns) + len(texts) + len(refs)


def cold_audit(b: ModuleType, dataset, spec, sync):
    from django.conf import settings

    from audit.runs import dispatch, planning
    from audit.runs.encoding import clear_memos

    shutil.rmtree(settings.EMBEDDING_CACHE_DIR, ignore_errors=True)
    clear_memos()
    with b.Clock(sync) as clock:
        run = dispatch.run_inline(planning.create_run(dataset, [spec]))
    assert run.status == "done", run.error
    return clock


def warm_audit(b: ModuleType, dataset, spec, sync):
    """The same audit again, warm cache, as a fresh worker (memos cleared). Returns its clock and
    whether it built the model (it should not: every embedding is in the cache)."""
    from django.conf import settings

    from audit.runs import dispatch, planning
    from audit.runs.encoding import clear_memos, get_retriever

    clear_memos()
    with b.Clock(sync) as clock:
        run = dispatch.run_inline(planning.create_run(dataset, [spec]))
    assert run.status == "done", run.error
    built = get_retriever(
        spec,
        device=settings.AUDIT_DEVICE or None,
        batch_size=settings.AUDIT_BATCH_SIZE,
        precision=settings.AUDIT_PRECISION,
    ).is_built
    return clock, built


def main_hf(args, b: ModuleType) -> None:
    """``b``: bench/audit.py's module (its Clock, Runs, setup_django, set_up_as_worker, build_world)."""
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="cirval-bench-audit-hf-"))
    work.mkdir(parents=True, exist_ok=True)
    b.setup_django(work, args.device, args.precision, args.loader_workers)
    import logging

    import torch

    from audit.runs.encoding import clear_memos
    from retrieval.retrievers.hf import tiny

    logging.getLogger().setLevel(logging.WARNING)
    t0 = time.perf_counter()
    folder = tiny.BUILDERS[BACKBONE[args.hf_family]](work / "tiny-checkpoint")
    spec = f"hf:{args.hf_family}@{folder}"
    print(f"tiny {BACKBONE[args.hf_family]} checkpoint built offline in {time.perf_counter() - t0:.1f} s")
    device = b.set_up_as_worker(args)
    demo_dir = work / "demo"
    dataset, gallery_ids, images, index, turns, _ = b.build_world(args, [spec], demo_dir)

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    wholes, passes, audits, warms, n_passes, warm_built = [], [], [], [], 0, False
    for _ in range(max(1, args.repeat)):
        clear_memos()
        whole, only, n_passes = bare_passes(b, spec, demo_dir, images, gallery_ids, index, turns, sync)
        wholes.append(whole)
        passes.append(only)
        audits.append(cold_audit(b, dataset, spec, sync))
        warm, warm_built = warm_audit(b, dataset, spec, sync)
        warms.append(warm)
    bare, alone, audit = b.Runs(wholes), b.Runs(passes), b.Runs(audits)
    print(
        f"\nhf: figure · {spec.split('@')[0]} (tiny random weights) · {len(turns)} queries · "
        f"{len(gallery_ids)} gallery images · {n_passes} forward passes (candidates, composed, distinct texts, "
        f"distinct references)"
    )
    for name, runs in (
        ("bare forward passes (model built)", bare),
        ("  the passes alone", alone),
        ("full audit, cold cache", audit),
    ):
        print(f"  {name:<36} {runs.wall:8.2f} s wall  {runs.cpu:8.2f} s CPU  ({runs.spread()})")
    warm = b.Runs(warms)
    print(
        f"  {'same audit again, warm cache':<36} {warm.wall:8.2f} s wall  {warm.cpu:8.2f} s CPU  ({warm.spread()}); "
        f"model built: {'yes (it should not be)' if warm_built else 'no'}"
    )
    print(
        f"  audit / bare passes: {audit.wall / bare.wall:.2f} wall, {audit.cpu / bare.cpu:.2f} CPU (goal <= 1.3); "
        f"to the passes alone: {audit.wall / alone.wall:.2f} wall"
    )
    clear_memos()
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
