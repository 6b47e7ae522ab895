"""Usage: python bench/audit.py [--device auto|cpu|cuda] [--n-gallery N] [--n-single N]
[--n-sessions N] [--retriever SPEC ...] [--precision fp32|amp] [--loader-workers N]
[--naive-queries N] [--repeat N] [--keep DIR]

Timing of the shortcut audit on the demo world (retrieval.demo.build_demo: a held-out-style
validation split, its gallery holding every reference and target image plus distractors;
loaded into a throw-away SQLite database under a temporary CIRVAL_VAR_DIR), with the two tiny
random-weight retrievers by default. Prints figures; asserts nothing.

1. bare encode, the MINIMAL baseline, as a fresh process does it: each retriever's model
   built, every gallery image decoded once, then encoded by each retriever, and every
   distinct query text encoded by each retriever, batched, and nothing else (the reference
   images are gallery images, so an audit never needs to encode them again; any that are
   not are added and counted). The audit decodes each gallery file once for all its
   retrievers too (AUDIT_RETRIEVERS_TOGETHER), so the baseline does the same. No audit
   can do less work than this. The encode alone, with models built beforehand, is printed
   too;
2. full audit, cold cache: the real in-process audit as a fresh worker runs it (models
   built, plan, chunks, three modalities, labels, subsets); goal: at most 1.3x the bare
   encode. Both include their model builds; the ratio of the audit to the encode alone
   (an audit that builds its models against an encode that does not) is printed beside it;
3. the same audit again, warm embedding cache, in a "fresh process" (the in-process
   retriever and gallery memos cleared first, so the gallery is read back from the cache
   and the model is NOT built when nothing is encoded); goal: cold / warm >= 10;
4. the naive way (reference implementation here, not in the product), as a fresh process
   runs it: each retriever's model built, then each query encoded separately for each
   modality (image and text for the multimodal query, then the text alone, then the image
   alone, batch size 1) and a full argsort of the gallery per query and modality; goal:
   naive / CIRVal >= 2.5 (on all queries unless --naive-queries). The bare encode, the cold
   audit and the naive way each build their models, so their ratios compare like with like;
   the naive way's ratio without its model builds is printed beside it.

Steps 1 to 4 are run ``--repeat`` times (default 3), interleaved (bare, cold, warm, naive, bare,
cold, ...) so that a burst of load from other processes falls on all of them alike; each figure
is the median of its runs, printed with the spread (min-max), and the ratios are ratios of
medians. Every cold run starts from an empty embedding cache and cleared memos (it builds its
models); every warm run re-audits with the cache the cold run before it filled.

Queries/second counts audited queries times retrievers (one query = its three
modalities). Wall and CPU seconds (this process plus finished children) are printed: the
CPU time is the steadier figure on a shared machine. Runs on CUDA when available (--device
auto), or where --device says, in fp16 autocast on CUDA (--precision amp, the default).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: as a worker sets them, config.worker_tuning.torch_threads)",
    )
    p.add_argument("--precision", default="amp", help="amp (fp16 autocast on CUDA; plain fp32 on CPU) or fp32")
    p.add_argument(
        "--loader-workers",
        type=int,
        default=None,
        help="image loader processes of the audit (default: from the cores left, see config/worker_tuning.py)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="runs of the bare encode, the cold and the warm audit (medians reported; default 3)",
    )
    p.add_argument("--keep", default=None, help="Work in this folder and keep it (default: a temporary one).")
    p.add_argument(
        "--hf",
        action="store_true",
        help="instead: the hf: figure, a tiny hf: checkpoint's audit / its bare forward passes (bench/audit_hf.py)",
    )
    p.add_argument("--hf-family", default="vlm2vec", help="the hf: family of --hf (default vlm2vec, on Qwen2-VL)")
    return p.parse_args()


def setup_django(work: Path, device: str, precision: str = "fp32", loader_workers: int | None = None) -> None:
    os.environ["CIRVAL_VAR_DIR"] = str(work / "var")
    os.environ["DATABASE_URL"] = f"sqlite:///{work / 'var' / 'bench.sqlite3'}"
    os.environ["CELERY_BROKER_URL"] = "filesystem://"
    os.environ["EMBEDDING_CACHE_DIR"] = str(work / "embeddings")
    os.environ["AUDIT_DEVICE"] = "" if device == "auto" else device
    os.environ["AUDIT_PRECISION"] = precision
    if loader_workers is not None:
        os.environ["AUDIT_LOADER_WORKERS"] = str(loader_workers)
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


class Clock:
    """Wall and CPU seconds (this process and its finished children) of a ``with`` block."""

    def __init__(self, sync=lambda: None) -> None:
        self.sync, self.wall, self.cpu = sync, 0.0, 0.0

    def __enter__(self) -> Clock:
        self._w, self._c = time.perf_counter(), self._cpu()
        return self

    def __exit__(self, *exc) -> None:
        self.sync()
        self.wall, self.cpu = time.perf_counter() - self._w, self._cpu() - self._c

    @staticmethod
    def _cpu() -> float:
        # getrusage, not os.times (10 ms ticks: a 0.1 s warm audit read as 0.10 or 0.11 s)
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class Runs:
    """The clocks of repeated runs of one step: ``wall`` and ``cpu`` are the medians."""

    def __init__(self, clocks: list[Clock]) -> None:
        self.clocks = clocks
        self.wall = statistics.median(c.wall for c in clocks)
        self.cpu = statistics.median(c.cpu for c in clocks)

    def spread(self) -> str:
        if len(self.clocks) < 2:
            return ""
        walls, cpus = [c.wall for c in self.clocks], [c.cpu for c in self.clocks]
        return (
            f"{len(self.clocks)} runs, wall {min(walls):.3f}-{max(walls):.3f} s, CPU {min(cpus):.3f}-{max(cpus):.3f} s"
        )


def _minus(a: Clock, b: Clock) -> Clock:
    """A clock of ``a`` less the part ``b`` timed inside it."""
    out = Clock()
    out.wall, out.cpu = a.wall - b.wall, a.cpu - b.cpu
    return out


def line(name: str, clock: Clock | Runs, n_queries: int, note: str = "") -> None:
    qps = n_queries / clock.wall if clock.wall > 0 else float("inf")
    print(f"  {name:<36}{clock.wall:>8.3f} s {clock.cpu:>8.3f} s {qps:>9.1f} q/s  {note}")


def naive_rank_one(query, gallery, positives, exclude):
    """Best rank of the positives for one query: the full score vector, then per positive a full
    sort of the gallery by score with the positive placed after every item it ties with
    (:func:`tests.reference_impl.pessimistic_rank`: the product's rule, pessimistic ties);
    the excluded item (the reference) left out."""
    return naive_rank_one_scores(naive_scores(query, gallery), positives, exclude)


def naive_rank_one_scores(scores, positives, exclude):
    """Best pessimistic rank of the positives in one score vector (the excluded item left out)."""
    from tests.reference_impl import pessimistic_rank

    return min((pessimistic_rank(scores, p, exclude) for p in positives if p != exclude), default=None)


def naive_scores(query, gallery):
    """The naive way's score of every gallery item: float32, as the product."""
    return (gallery.float() @ query.float().reshape(-1)).cpu().numpy()


def naive_way(
    specs, demo_dir, images, gallery_ids, turns, positives_of, index, sync
) -> tuple[dict, Clock, Clock, dict]:
    """The naive audit, as a fresh process runs it: each retriever's model built (as the bare
    encode and the cold audit build theirs), then each query encoded separately per modality
    (batch 1) and a full argsort per query and modality. Returns (ranks, the whole, the model
    builds, the embeddings it ranked: ``spec -> gallery`` and ``(query, spec) -> (mm, text, image)``)."""
    from django.conf import settings

    from retrieval.encoders import build_retriever, load_image

    naive_ranks: dict[tuple[int, str], tuple] = {}
    embeddings: dict = {}
    with Clock(sync) as whole:
        with Clock(sync) as builds:
            retrievers = [
                build_retriever(
                    s,
                    device=settings.AUDIT_DEVICE or None,
                    batch_size=settings.AUDIT_BATCH_SIZE,
                    precision=settings.AUDIT_PRECISION,
                )
                for s in specs
            ]
        for spec, r in zip(specs, retrievers):
            gallery = r.embed_images([load_image(demo_dir / images[i].path) for i in gallery_ids]).to(r.device)
            embeddings[spec] = gallery
            for t in turns:
                pos = positives_of.get(t.query_id, [])
                ex = index.get(t.reference_image_id)
                ref = demo_dir / t.reference_image.path
                mm = r.compose(r.embed_images([load_image(ref)]), r.embed_texts([t.text])).to(r.device)
                txt = r.embed_texts([t.text]).to(r.device)
                img = r.embed_images([load_image(ref)]).to(r.device)
                embeddings[(t.query_id, spec)] = (mm, txt, img)
                naive_ranks[(t.query_id, spec)] = tuple(naive_rank_one(e, gallery, pos, ex) for e in (mm, txt, img))
    return naive_ranks, whole, builds, embeddings


#: Largest score gap a near-tie may span, by precision: the naive way encodes each query at
#: batch size 1 and scores it by a matrix-vector product, the audit encodes in batches and
#: scores by blocked matrix products; float32 sums in another order move an embedding's
#: scores by ~1e-7..1e-5 (fp16 autocast on CUDA: ~1e-3).
NEAR_TIE = {"fp32": 1e-4, "amp": 1e-2}


def tie_gap(scores, positives, exclude, rank) -> float:
    """The smallest score gap ``d`` such that reordering gallery items that score within ``d`` of
    a positive turns the naive ranking of ``scores`` into best rank ``rank`` (0: the naive
    rank itself; inf: no reordering does). Better than the naive best rank: one positive
    moves up past the ``k`` items closest above it; worse: every positive ranked better moves
    down past the items closest below it."""
    import numpy as np

    keep = np.ones(scores.size, dtype=bool)
    if exclude is not None:
        keep[exclude] = False
    pos = [p for p in positives if p != exclude]
    if rank is None or not pos:
        return 0.0 if rank is None and not pos else float("inf")
    naive = {p: naive_rank_one_scores(scores, [p], exclude) for p in pos}
    best = min(naive.values())

    def gap(p: int) -> float:
        others = keep.copy()
        others[p] = False
        diff = scores[others] - scores[p]
        steps = naive[p] - rank
        near = np.sort(diff[diff >= 0]) if steps > 0 else np.sort(-diff[diff < 0])
        return float(near[abs(steps) - 1]) if 0 < abs(steps) <= near.size else (0.0 if steps == 0 else float("inf"))

    if rank == best:
        return 0.0
    if rank < best:
        return min(gap(p) for p in pos)
    return max(gap(p) for p in pos if naive[p] < rank)


def explain_disagreement(naive_ranks, audit_ranks, embeddings, positives_of, exclude_of, tolerance) -> str:
    """How many (query, retriever) pairs agree, and for the others the near-tie gap that
    explains each differing rank (:func:`tie_gap`); pairs no gap within ``tolerance`` explains
    are named."""
    agree, gaps, unexplained, by_modality = 0, [], [], {"mm": 0, "text": 0, "image": 0}
    for key, ranks in naive_ranks.items():
        audited = audit_ranks.get(key)
        if audited == ranks:
            agree += 1
            continue
        query, spec = key
        for n, (modality, mine, theirs) in enumerate(zip(by_modality, ranks, audited or (None,) * 3)):
            if mine == theirs:
                continue
            by_modality[modality] += 1
            scores = naive_scores(embeddings[key][n], embeddings[spec])
            gap = tie_gap(scores, positives_of.get(query, []), exclude_of[query], theirs)
            gaps.append(gap)
            if gap > tolerance:
                unexplained.append(f"query {query} {spec} {modality}: naive {mine}, audit {theirs}")
    text = f"naive and audit ranks agree on {agree}/{len(naive_ranks)} pairs"
    if not gaps:
        return text
    counts = ", ".join(f"{m} {c}" for m, c in by_modality.items() if c)
    explained = [g for g in gaps if g <= tolerance] or [float("nan")]
    text += (
        f"; the {len(naive_ranks) - agree} others differ in {len(gaps)} rank(s) ({counts}), "
        f"{len(gaps) - len(unexplained)} of them only by near-ties: each is the naive rank once the gallery items scoring "
        f"within {max(explained):.1e} of a positive are reordered (smallest such gap "
        f"{min(explained):.1e}; 0: the naive scores tie exactly there, the audit's, which would rank a tie the same "
        f"way, are apart). The "
        f"naive way's batch-1 encodings and matrix-vector scores round differently from the audit's batched "
        f"encodings and blocked products. "
        f"{len(unexplained)} not explained by a gap <= {tolerance:g}"
    )
    return text + "".join(f"\n    {u}" for u in unexplained)


def same_scores_agreement(
    naive_ranks, embeddings, positives_of, exclude_of, chunk: int = 4096, query_chunk: int = 1024
) -> str:
    """The tie rule, checked apart from rounding: :func:`retrieval.ranking.rank_queries` and a full
    argsort with pessimistic ties (:func:`naive_rank_one_scores`) rank the same score matrix (the
    naive way's embeddings, its queries stacked and scored by the very blocked products
    ``rank_queries`` computes; a matrix-vector product, as the naive way's timing loop does, or
    another block size rounds differently in the last bit)."""
    import torch

    from retrieval.ranking import rank_queries

    same = 0
    for spec in {s for _, s in naive_ranks}:
        keys = [k for k in naive_ranks if k[1] == spec]
        gallery = embeddings[spec].float()
        positives = [positives_of.get(q, []) for q, _ in keys]
        exclude = [exclude_of[q] for q, _ in keys]
        modal = []
        for n in range(3):
            queries = torch.cat([embeddings[k][n].float().reshape(1, -1) for k in keys]).to(gallery.device)
            product = rank_queries(
                queries, gallery, positives, exclude, top_k=0, chunk_size=chunk, query_chunk_size=query_chunk
            ).best_rank
            scores = (
                torch.cat(
                    [
                        torch.cat(
                            [
                                queries[a : a + query_chunk] @ gallery[b : b + chunk].T
                                for b in range(0, gallery.shape[0], chunk)
                            ],
                            1,
                        )
                        for a in range(0, len(keys), query_chunk)
                    ]
                )
                .cpu()
                .numpy()
            )
            argsort = [naive_rank_one_scores(scores[i], positives[i], exclude[i]) for i in range(len(keys))]
            modal.append([a == b for a, b in zip(product, argsort)])
        same += sum(1 for row in zip(*modal) if all(row))
    return (
        f"tie rule: retrieval.ranking.rank_queries and a full argsort with pessimistic ties agree on "
        f"{same}/{len(naive_ranks)} pairs when they rank the same scores"
    )


def print_figures(specs, n_q, pool, n_gallery, n_naive, clocks, cold, warm, agreement, built) -> None:
    encode, encode_only, cold_c, warm_c, naive_c, naive_builds = clocks
    print(
        f"\n{n_q} single-turn queries x {len(specs)} retrievers = {pool} (query, retriever) pairs, "
        f"{n_gallery} gallery images; medians of {len(encode.clocks)} runs"
    )
    print(f"  {'':<36}{'wall':>10} {'CPU':>10} {'':>13}")
    line("bare encode (models + gallery + texts)", encode, pool, "the minimal baseline (each image decoded once)")
    line("  of which the encode alone", encode_only, pool, f"models built in {encode.wall - encode_only.wall:.3f} s")
    line(
        "full audit, cold cache",
        cold_c,
        pool,
        f"= {cold_c.wall / encode.wall:.2f}x bare encode wall, "
        f"{cold_c.cpu / encode.cpu:.2f}x CPU (goal <= 1.3x); {cold_c.wall / encode_only.wall:.2f}x the encode alone",
    )
    line(
        "repeat audit, warm cache",
        warm_c,
        pool,
        f"cold / warm = {cold_c.wall / warm_c.wall:.1f}x wall, {cold_c.cpu / warm_c.cpu:.1f}x CPU (goal >= 10x)",
    )
    scale = n_q / n_naive  # the model builds are not scaled: a fresh process builds each model once
    naive_all = naive_builds.wall + (naive_c.wall - naive_builds.wall) * scale
    naive_cpu = naive_builds.cpu + (naive_c.cpu - naive_builds.cpu) * scale
    line(
        f"naive ({n_naive} queries per retriever)",
        naive_c,
        n_naive * len(specs),
        f"naive / CIRVal = {naive_all / cold_c.wall:.2f}x wall, {naive_cpu / cold_c.cpu:.2f}x CPU"
        f"{' (extrapolated to all queries)' if n_naive < n_q else ''} (goal >= 2.5x)",
    )
    line(
        "  of which the naive way alone",
        Runs([_minus(n, b) for n, b in zip(naive_c.clocks, naive_builds.clocks)]),
        n_naive * len(specs),
        f"models built in {naive_builds.wall:.3f} s; without them, naive / full cold audit = "
        f"{(naive_all - naive_builds.wall) / cold_c.wall:.2f}x wall",
    )
    if len(encode.clocks) > 1:
        print("spread:")
        for name, runs in (
            ("bare encode", encode),
            ("encode alone", encode_only),
            ("cold audit", cold_c),
            ("warm audit", warm_c),
            ("naive", naive_c),
            ("naive builds", naive_builds),
        ):
            print(f"  {name:<14}{runs.spread()}")
        print(
            "  per run (bare, cold, warm, naive wall s): "
            + "; ".join(
                f"{b.wall:.3f}, {c.wall:.3f}, {w.wall:.3f}, {n.wall:.3f}"
                for b, c, w, n in zip(encode.clocks, cold_c.clocks, warm_c.clocks, naive_c.clocks)
            )
        )
    t = cold.timings
    print(
        f"\ncold audit breakdown (last run): encode gallery {t.get('encode_gallery', 0):.3f} s, encode queries "
        f"{t.get('encode_queries', 0):.3f} s, read gallery {t.get('load_gallery', 0):.3f} s, rank+write "
        f"{t.get('rank', 0):.3f} s, aggregate {t.get('aggregate', 0):.3f} s; embeddings encoded "
        f"{t['cache'].get('encoded', 0)}"
    )
    w = warm.timings
    print(
        f"warm audit: embeddings encoded {w['cache'].get('encoded', 0)}, cache hits "
        f"{w['cache'].get('gallery_hits', 0) + w['cache'].get('query_image_hits', 0) + w['cache'].get('text_hits', 0)}"
        f", models built {built} (the warm run builds none when it encodes nothing)"
    )
    print(f"labels: {cold.summary['counts']}\n{agreement}")


def bare_encode(specs, demo_dir, images, gallery_ids, turns, sync, quiet: bool = False) -> tuple[Clock, Clock]:
    """The minimal baseline, as a fresh process: each model built, every gallery image decoded
    once and encoded by each retriever, and every distinct text, per retriever, batched (plus
    any reference image outside the gallery, counted). Returns (the whole, the encode alone)."""
    from django.conf import settings

    from retrieval.encoders import build_retriever, load_image

    extra_refs = {t.reference_image_id for t in turns} - set(gallery_ids)
    texts = list(dict.fromkeys(t.text for t in turns))
    if not quiet:
        print(
            f"bare encode baseline: {len(specs)} model builds + {len(gallery_ids)} gallery images (decoded once) + "
            f"{len(texts)} distinct texts + {len(extra_refs)} reference images outside the gallery, per retriever"
        )
    with Clock(sync) as whole:
        retrievers = [
            build_retriever(
                s,
                device=settings.AUDIT_DEVICE or None,
                batch_size=settings.AUDIT_BATCH_SIZE,
                precision=settings.AUDIT_PRECISION,
            )
            for s in specs
        ]
        with Clock(sync) as encode:
            gallery = [load_image(demo_dir / images[i].path) for i in gallery_ids]
            extra = [load_image(demo_dir / t.reference_image.path) for t in turns if t.reference_image_id in extra_refs]
            for r in retrievers:
                r.embed_images(gallery)
                if extra:
                    r.embed_images(extra)
                r.embed_texts(texts)
    return whole, encode


def build_world(args, specs, demo_dir):
    """The demo world loaded and each retriever built once to warm up; the gallery, queries and positives."""
    from django.conf import settings

    from audit.runs.encoding import get_retriever
    from retrieval.demo import build_demo
    from retrieval.encoders import load_image
    from retrieval.evaltargets import positive_image_ids
    from retrieval.loader import load_parsed
    from retrieval.models import Dataset, GalleryEntry, Image, Turn

    t0 = time.perf_counter()
    parsed = build_demo(demo_dir, n_gallery=args.n_gallery, n_single=args.n_single, n_sessions=args.n_sessions)
    load_parsed(parsed, "demo", images_root=demo_dir)
    dataset = Dataset.objects.get(name="demo")
    print(
        f"demo world: {len(parsed.images)} images, {args.n_single} single-turn queries, "
        f"{args.n_sessions} sessions (built and loaded in {time.perf_counter() - t0:.1f} s); "
        f"retrievers: {', '.join(specs)}"
    )

    # Build and warm up each retriever once (the bare encode, the cold audit and the naive way,
    # as fresh processes, then build their own), so that one-time start-up costs (open_clip's
    # registries, the first forward pass's allocations) fall on none of them.
    t0 = time.perf_counter()
    retrievers = [
        get_retriever(
            s,
            device=settings.AUDIT_DEVICE or None,
            batch_size=settings.AUDIT_BATCH_SIZE,
            precision=settings.AUDIT_PRECISION,
        )
        for s in specs
    ]
    probe = load_image(demo_dir / next(iter(parsed.images.values())).path)
    for r in retrievers:
        r.embed_images([probe])
        r.embed_texts(["warm up"])
    print(f"first model build + warm-up: {time.perf_counter() - t0:.2f} s")

    gallery_ids = list(
        GalleryEntry.objects.filter(dataset=dataset, split="val").order_by("ordinal").values_list("image_id", flat=True)
    )
    images = Image.objects.in_bulk(gallery_ids)
    index = {pk: n for n, pk in enumerate(gallery_ids)}
    turns = list(
        Turn.objects.filter(query__dataset=dataset, query__n_turns=1, index=1)
        .select_related("reference_image")
        .order_by("query__ordinal")
    )
    positives_of = {
        q: [index[i] for i in ids if i in index]
        for q, ids in positive_image_ids(dataset.format, [t.query_id for t in turns]).items()
    }
    return dataset, gallery_ids, images, index, turns, positives_of


def set_up_as_worker(args) -> str:
    """Torch threads and the heap as a worker sets them; prints the header; returns the device."""
    import torch
    from django.conf import settings

    from config.worker_tuning import default_loader_workers, freeze_startup_heap, torch_threads

    # As a worker would: the cores left after the web tier's reserve (on a loaded 2-core host,
    # two threads wait on each other's time slices in every small parallel op).
    torch.set_num_threads(
        args.threads
        or settings.WORKER_TORCH_THREADS
        or torch_threads(os.cpu_count() or 1, settings.WORKER_RESERVED_CORES, 1)
    )
    freeze_startup_heap()  # as every worker process does when it starts (its libraries out of the GC's scans)
    device = settings.AUDIT_DEVICE or ("cuda" if torch.cuda.is_available() else "cpu")
    print(
        f"CIRVal audit benchmark · python {platform.python_version()} · torch {torch.__version__} · "
        f"device {device}{' (' + torch.cuda.get_device_name(0) + ')' if device.startswith('cuda') else ''}"
        f" · {torch.get_num_threads()} CPU threads · precision {settings.AUDIT_PRECISION}"
        f" · loader workers {default_loader_workers()} · load {os.getloadavg()[0]:.2f}"
    )
    return device


def cold_and_warm(dataset, specs, sync) -> tuple[Any, Clock, Any, Clock, int]:
    """2. the full audit, cold cache, as a fresh worker runs it (memos cleared: it builds the
    models); 3. the same again, warm cache, as a fresh worker would (no memo: nothing built,
    the gallery re-read). Returns (cold run, its clock, warm run, its clock, models the warm run built)."""
    from django.conf import settings

    from audit.runs import dispatch, planning
    from audit.runs.encoding import clear_memos, get_retriever

    shutil.rmtree(settings.EMBEDDING_CACHE_DIR, ignore_errors=True)
    clear_memos()
    with Clock(sync) as cold_c:
        cold = dispatch.run_inline(planning.create_run(dataset, specs))
    assert cold.status == "done", cold.error
    clear_memos()
    with Clock(sync) as warm_c:
        warm = dispatch.run_inline(planning.create_run(dataset, specs))
    assert warm.status == "done", warm.error
    built = sum(
        1
        for s in specs
        if get_retriever(
            s,
            device=settings.AUDIT_DEVICE or None,
            batch_size=settings.AUDIT_BATCH_SIZE,
            precision=settings.AUDIT_PRECISION,
        ).is_built
    )
    return cold, cold_c, warm, warm_c, built


def main() -> None:
    args = parse_args()
    if args.hf:
        import audit_hf  # beside this script

        audit_hf.main_hf(args, sys.modules[__name__])
        return
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="cirval-bench-audit-"))
    work.mkdir(parents=True, exist_ok=True)
    setup_django(work, args.device, args.precision, args.loader_workers)

    import logging

    logging.getLogger().setLevel(logging.WARNING)
    import torch

    from audit.models import AuditRank
    from audit.runs.encoding import clear_memos

    specs = args.retrievers or DEFAULT_SPECS
    device = set_up_as_worker(args)
    demo_dir = work / "demo"
    dataset, gallery_ids, images, index, turns, positives_of = build_world(args, specs, demo_dir)
    n_q = len(turns)

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    # 1-4, repeated and interleaved: bare encode, cold audit, warm audit, the naive way
    encodes, encodes_only, colds, warms, naives, naive_builds, built = [], [], [], [], [], [], 0
    n_naive = min(args.naive_queries or n_q, n_q)
    for _ in range(max(1, args.repeat)):
        whole, encode_only = bare_encode(specs, demo_dir, images, gallery_ids, turns, sync, quiet=bool(encodes))
        encodes.append(whole)
        encodes_only.append(encode_only)
        cold, cold_one, warm, warm_one, warm_built = cold_and_warm(dataset, specs, sync)
        if not colds:  # the first cold run's ranks are compared with the naive way's
            first_cold = cold
        colds.append(cold_one)
        warms.append(warm_one)
        built = max(built, warm_built)
        naive_ranks, naive_one, naive_build, embeddings = naive_way(
            specs, demo_dir, images, gallery_ids, turns[:n_naive], positives_of, index, sync
        )
        naives.append(naive_one)
        naive_builds.append(naive_build)

    audit_ranks = {
        (q, s): (a, b, c)
        for q, s, a, b, c in AuditRank.objects.filter(run=first_cold).values_list(
            "query_id", "retriever", "mm", "text", "image"
        )
    }
    from django.conf import settings

    exclude_of = {t.query_id: index.get(t.reference_image_id) for t in turns}
    tolerance = NEAR_TIE["amp" if settings.AUDIT_PRECISION == "amp" and device.startswith("cuda") else "fp32"]
    agreement = (
        explain_disagreement(naive_ranks, audit_ranks, embeddings, positives_of, exclude_of, tolerance)
        + "\n"
        + same_scores_agreement(naive_ranks, embeddings, positives_of, exclude_of)
    )
    clocks = tuple(Runs(c) for c in (encodes, encodes_only, colds, warms, naives, naive_builds))
    print_figures(specs, n_q, n_q * len(specs), len(gallery_ids), n_naive, clocks, cold, warm, agreement, built)
    clear_memos()
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
