"""Time and memory of the validated export on large studies.

    python bench/export.py [--sizes 10000,100000] [--votes 3] [--chunk-size 1000]
                           [--database-url postgres://postgres@127.0.0.1:5432/cirval_bench_export]

Builds (directly with bulk_create) one study per size in a scratch database: that many
single-turn queries (one reference image, one target each), every item with ``--votes``
current judgements, all VALIDATED except one dissenting vote on every fifth item, hidden
categories alternating composition_required / unresolved. The default database is a SQLite
file under a temporary CIRVAL_VAR_DIR (deleted at the end unless --keep).

Each export then runs in a fresh child process (so its peak RSS is its own), twice: once
timed, once under tracemalloc for the peak of Python allocations. Printed per size: the
export time (target: under 30 s for 100,000 items), items per second, tracemalloc peak and
the child's own peak RSS (VmHWM: ru_maxrss would carry the parent's peak, i.e. the memory of
building the study, into every cell). Flat memory shows as peaks that do not grow with the
number of items.
Prints only; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from memory import peak_rss_kib
from pgdb import ensure_database

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
BATCH = 10_000


def setup_django(database_url: str, var_dir: str) -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ["CIRVAL_VAR_DIR"] = var_dir
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    # Production settings: with DEBUG on, Django keeps the text of every query it runs.
    os.environ.setdefault("DJANGO_DEBUG", "0")
    os.environ.setdefault("DJANGO_SECRET_KEY", "bench-only-not-a-secret")
    import django

    django.setup()


def build_study(n: int, votes: int) -> int:
    """A study of ``n`` items with ``votes`` judgements each; returns its id (reused if built)."""
    from django.contrib.auth import get_user_model
    from django.db import connection, transaction

    from annotation.models import Assignment, Judgement, RubricVersion, Study, StudyItem
    from annotation.sizes import add_items
    from audit.labels import SHORTCUT_FREE_LABELS
    from retrieval.models import Dataset, Image, Query, Target, Turn

    name = f"bench-export-{n}-{votes}"
    existing = Study.objects.filter(name=name).first()
    if existing is not None:
        return existing.pk
    started = time.perf_counter()
    print(f"building a study of {n} items x {votes} judgements ...", flush=True)
    User = get_user_model()
    users = []
    for i in range(votes):
        user, _ = User.objects.get_or_create(username=f"bench-annotator-{i:02d}")
        users.append(user)
    rubric = RubricVersion.builtin("validity")
    flags_valid = {
        f: False for f in ("INVALID_TEXT_QUERY", "INVALID_IMAGE_QUERY", "INVALID_TARGET_IMAGE", "QUERY_TOO_BROAD")
    }
    flags_broad = {**flags_valid, "QUERY_TOO_BROAD": True}
    with transaction.atomic():
        ds = Dataset.objects.create(name=f"bench-export-{n}", format="demo")
        ref = Image.objects.create(dataset=ds, external_id="ref", path="ref.png")
        study = Study.objects.create(name=name, rubric=rubric, overlap=votes, status=Study.Status.CLOSED)
        study.annotators.set(users)
        for start in range(0, n, BATCH):
            stop = min(n, start + BATCH)
            images = Image.objects.bulk_create(
                [Image(dataset=ds, external_id=f"t{i}", path=f"targets/t{i}.png") for i in range(start, stop)]
            )
            queries = Query.objects.bulk_create(
                [Query(dataset=ds, external_id=f"q{i}", split="test", ordinal=i) for i in range(start, stop)]
            )
            Turn.objects.bulk_create(
                [
                    Turn(
                        query=q,
                        index=1,
                        reference_image=ref,
                        texts=[{"text": f"make the object number {q.ordinal} red", "role": "caption"}],
                    )
                    for q in queries
                ]
            )
            Target.objects.bulk_create(
                [Target(query=q, image=img, is_primary=True, role="gt") for q, img in zip(queries, images)]
            )
            items = add_items(
                study,
                [
                    StudyItem(
                        study=study,
                        query=q,
                        hidden_category=SHORTCUT_FREE_LABELS[q.ordinal % 2],
                        stratum=ds.name,
                        order_key=q.ordinal,
                        taken=votes,
                        completed=votes,
                    )
                    for q in queries
                ],
            )
            assignments = Assignment.objects.bulk_create(
                [
                    Assignment(study=study, item=item, annotator=u, status=Assignment.Status.DONE, position=k)
                    for k, item in enumerate(items, start=start)
                    for u in users
                ]
            )
            judgements = []
            for a in assignments:
                dissent = a.position % 5 == 0 and a.annotator_id == users[-1].pk and votes > 2
                judgements.append(
                    Judgement(
                        assignment=a,
                        rubric=rubric,
                        category="QUERY_TOO_BROAD" if dissent else "VALIDATED",
                        flags=flags_broad if dissent else flags_valid,
                        validated=not dissent,
                        note="too many red objects" if dissent else "",
                        time_spent_ms=30_000,
                    )
                )
            Judgement.objects.bulk_create(judgements)
            print(f"  {stop} / {n}", flush=True)
    if connection.vendor == "postgresql":
        with connection.cursor() as c:
            c.execute("ANALYZE")
    print(f"  built in {time.perf_counter() - started:.1f} s", flush=True)
    return study.pk


def child(study_id: int, chunk_size: int, traced: bool, out_root: str) -> None:
    """Run one export in this process and print a JSON line of measurements."""
    import tracemalloc

    from annotation.export.validated import export_study
    from annotation.models import Study

    study = Study.objects.select_related("rubric").get(pk=study_id)
    if traced:
        tracemalloc.start()
    started = time.perf_counter()
    result = export_study(
        study, Path(out_root) / f"study{study_id}-{'traced' if traced else 'timed'}", chunk_size=chunk_size
    )
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1] if traced else None
    print(
        json.dumps(
            {
                "seconds": seconds,
                "tracemalloc_peak": peak,
                "peak_rss_kib": peak_rss_kib(),
                "validated": result.manifest["counts"]["validated"],
                "bytes": sum(f["bytes"] for f in result.manifest["files"]),
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000", help="Comma-separated item counts.")
    ap.add_argument("--votes", type=int, default=3, help="Judgements per item.")
    ap.add_argument("--chunk-size", type=int, default=1000)
    ap.add_argument("--database-url", default=None, help="Default: SQLite under a temporary CIRVAL_VAR_DIR.")
    ap.add_argument("--var-dir", default=None, help="CIRVAL_VAR_DIR (default: a temporary folder).")
    ap.add_argument("--keep", action="store_true", help="Keep the temporary folder (database and exports).")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child is not None:
        setup_django(args.database_url, args.var_dir)
        child(args.child, args.chunk_size, args.traced, str(Path(args.var_dir) / "bench-exports"))
        return

    var_dir = args.var_dir or tempfile.mkdtemp(prefix="cirval-bench-export-")
    database_url = args.database_url or f"sqlite:///{Path(var_dir) / 'bench.sqlite3'}"
    if database_url.startswith("postgres"):
        ensure_database(database_url)
    setup_django(database_url, var_dir)
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    studies = {n: build_study(n, args.votes) for n in sizes}
    connection.close()
    print(
        f"\ndatabase: {connection.vendor} ({database_url}); chunk size {args.chunk_size}; "
        f"{args.votes} judgements per item"
    )
    print(
        f"{'items':>8} {'export s':>9} {'items/s':>9} {'output MB':>10} {'tracemalloc peak MB':>20} "
        f"{'peak RSS MB':>13} {'(traced run)':>13}"
    )
    try:
        for n, study_id in studies.items():
            runs = {}
            for traced in (False, True):
                cmd = [
                    sys.executable,
                    __file__,
                    "--child",
                    str(study_id),
                    "--chunk-size",
                    str(args.chunk_size),
                    "--database-url",
                    database_url,
                    "--var-dir",
                    var_dir,
                ] + (["--traced"] if traced else [])
                done = subprocess.run(cmd, check=True, capture_output=True, text=True)
                runs[traced] = json.loads(done.stdout.strip().splitlines()[-1])
            timed, traced_run = runs[False], runs[True]
            print(
                f"{n:>8} {timed['seconds']:>9.2f} {n / timed['seconds']:>9.0f} {timed['bytes'] / 1e6:>10.1f} "
                f"{traced_run['tracemalloc_peak'] / 1e6:>20.2f} {timed['peak_rss_kib'] / 1024:>13.1f} "
                f"{traced_run['peak_rss_kib'] / 1024:>13.1f}",
                flush=True,
            )
            shutil.rmtree(Path(var_dir) / "bench-exports", ignore_errors=True)
        print("target: under 30 s for 100,000 items; memory peaks should not grow with the items")
    finally:
        if not args.keep and not args.var_dir:
            shutil.rmtree(var_dir, ignore_errors=True)
        elif args.keep:
            print(f"kept {var_dir}")


if __name__ == "__main__":
    main()
