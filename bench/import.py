"""Time and peak memory of importing: fresh import and re-import of unchanged data.

    python bench/import.py [--case cirr|mbeir|all] [--sizes 4000,67000] [--no-ext]
                           [--pools 20000,200000] [--pool-queries 4000] [--keep]
                           [--database-url postgres://postgres@127.0.0.1:5432/cirval_bench_import]

Case ``cirr`` (the default) grows the query file; case ``mbeir`` grows an M-BEIR candidate pool.

For every size, writes synthetic CIRR rc2 files generated from the format of the real
excerpts in ``shared/reference/datasets/cirr`` (``cap.rc2.val``, ``cap.ext.rc2.val`` and
``split.rc2.val``: the same keys, value types and shapes, with captions, soft scores and
img_set sizes taken round-robin from the real records; about 0.55 images per query, as in
CIRR val's 4,181 triplets over 2,297 images), into a scratch SQLite database under a
temporary CIRVAL_VAR_DIR (or the --database-url given, one database per size).

Each import runs in a fresh child process through ``retrieval.services.import_files`` (what
``manage.py import_dataset`` runs), so its peak RSS (VmHWM, see :func:`peak_rss_kib`) is its
own: first the fresh import, then the re-import of the same files. No images root is given
(image files are not probed; that cost is the same for a fresh import and a re-import).

Case ``mbeir`` writes, for every pool size, an M-BEIR candidate pool of that many lines
(``mbeir_cirr_task7_test_cand_pool.jsonl``, rows shaped like the fixture's
``{txt, img_path, modality, did, src_content}``, one in a hundred text-only), with a fixed
number of queries (``--pool-queries``, default 4,000 as in M-BEIR's CIRR task 7 test split)
whose reference images and positives are pool images, and a qrels file with one positive
per query; so what grows is the pool alone.

Printed per size: wall and CPU seconds and peak RSS of each (CPU time is the steadier
figure on a shared machine); then the goals: re-import / fresh time
(goal <= 1.2) and peak RSS at the largest size / at the smallest (goal <= 1.5).
Prints only; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from memory import peak_rss_kib

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
REFERENCE = ROOT.parent / "shared" / "reference" / "datasets" / "cirr"
MBEIR_FIXTURES = ROOT / "tests" / "fixtures" / "datasets" / "mbeir"
IMAGES_PER_QUERY = 2297 / 4181


def _reference_records() -> list[dict]:
    path = REFERENCE / "cap.rc2.val.sample.json"
    if not path.is_file():
        path = ROOT / "tests" / "fixtures" / "datasets" / "cirr" / "cap.rc2.val.sample.json"
    return json.loads(path.read_text(encoding="utf-8"))


def _image(n: int) -> str:
    """A CIRR-style image id (``dev-<group>-<k>-img<j>``) for image number ``n``."""
    return f"dev-{n // 8}-{(n // 2) % 4}-img{n % 2}"


def write_files(folder: Path, n: int, with_ext: bool) -> list[Path]:
    """Write ``n`` synthetic CIRR triplets (+ ext captions, + the split file) into ``folder``."""
    models = _reference_records()
    n_images = max(8, int(n * IMAGES_PER_QUERY))
    cap, ext = [], []
    for i in range(n):
        model = models[i % len(models)]
        members = [
            _image((i * 7 + k * 13) % n_images) for k in range(len(model.get("img_set", {}).get("members", [])) or 6)
        ]
        reference, target = members[0], members[1]
        soft = {target: 1.0, **{m: s for m, s in zip(members[2:], [v for k, v in model["target_soft"].items()][1:])}}
        cap.append(
            {
                "pairid": i,
                "reference": reference,
                "target_hard": target,
                "target_soft": soft,
                "caption": f"{model['caption']} ({i})",
                "img_set": {"id": i // 6, "members": members, "reference_rank": 0, "target_rank": 1},
            }
        )
        ext.append(
            {
                "pairid": i,
                "reference": reference,
                "target_hard": target,
                "caption_extend": {str(k): f"{model['caption']} / variant {k}" for k in range(4)},
            }
        )
    split = {_image(m): f"./dev/{_image(m)}.png" for m in range(n_images)}
    files = {"cap.rc2.val.json": cap, "split.rc2.val.json": split}
    if with_ext:
        files["cap.ext.rc2.val.json"] = ext
    paths = []
    for name, data in files.items():
        path = folder / name
        # one record per line, as the release files are laid out
        if isinstance(data, list):
            path.write_text("[\n" + ",\n".join(json.dumps(r) for r in data) + "\n]\n", encoding="utf-8")
        else:
            path.write_text(json.dumps(data, indent=0), encoding="utf-8")
        paths.append(path)
    return paths


def _pool_row(n: int, models: list[dict]) -> dict:
    """Pool line number ``n``: did ``8:<n+1>``, a CIRR-style image path (text-only every 100th)."""
    model = models[n % len(models)]
    name = _image(n)
    if n % 100 == 99:
        return {**model, "did": f"8:{n + 1}", "img_path": None, "modality": "text", "txt": f"a caption {n}"}
    return {
        **model,
        "did": f"8:{n + 1}",
        "img_path": f"mbeir_images/cirr_images/dev/{name}.jpg",
        "src_content": json.dumps({"id": name}),
    }


def write_mbeir_files(folder: Path, pool_size: int, n_queries: int) -> list[Path]:
    """An M-BEIR pool of ``pool_size`` lines, ``n_queries`` queries into it and their qrels."""
    pools = [json.loads(line) for line in (MBEIR_FIXTURES / "mbeir_cirr_task7_cand_pool.jsonl").open()]
    queries = [json.loads(line) for line in (MBEIR_FIXTURES / "mbeir_cirr_task7_test.jsonl").open()]
    image_lines = [n for n in range(min(pool_size, 1000)) if n % 100 != 99]
    pool = folder / "mbeir_cirr_task7_test_cand_pool.jsonl"
    with pool.open("w", encoding="utf-8") as out:
        for n in range(pool_size):
            out.write(json.dumps(_pool_row(n, pools)) + "\n")
    query_file = folder / "mbeir_cirr_task7_test.jsonl"
    qrels = folder / "mbeir_cirr_task7_test_qrels.txt"
    with query_file.open("w", encoding="utf-8") as out, qrels.open("w", encoding="utf-8") as rel:
        for i in range(n_queries):
            reference = (i * 7919) % pool_size
            reference = reference if reference % 100 != 99 else reference - 1
            target = f"8:{(i * 104729) % pool_size + 1}"
            model = queries[i % len(queries)]
            out.write(
                json.dumps(
                    {
                        **model,
                        "qid": f"7:{i + 1}",
                        "query_txt": f"{model['query_txt']} ({i})",
                        "query_img_path": f"mbeir_images/cirr_images/dev/{_image(reference)}.jpg",
                        "pos_cand_list": [target],
                        "neg_cand_list": [f"8:{image_lines[i % len(image_lines)] + 1}"],
                    }
                )
                + "\n"
            )
            rel.write(f"7:{i + 1} 0 {target} 1 7\n")
    return [query_file, pool, qrels]


def setup_django(database_url: str, var_dir: str) -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ["CIRVAL_VAR_DIR"] = var_dir
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ.setdefault("DJANGO_DEBUG", "0")  # with DEBUG on, Django keeps every query's text
    os.environ.setdefault("DJANGO_SECRET_KEY", "bench-only-not-a-secret")
    import django

    django.setup()


def child(step: str, fmt: str, paths: list[str]) -> None:
    """Run one step in this (fresh) process and print its figures as JSON."""
    if step == "migrate":
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        return
    from retrieval.services import import_files

    before = resource.getrusage(resource.RUSAGE_SELF)
    cpu_before = before.ru_utime + before.ru_stime
    started = time.perf_counter()
    report = import_files(fmt, "bench", [Path(p) for p in paths])
    seconds = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime - cpu_before
    print(
        json.dumps(
            {
                "seconds": seconds,
                "cpu_seconds": cpu,
                "peak_rss_kib": peak_rss_kib(),
                "queries": report.queries,
                "created": report.queries_created,
                "unchanged": report.queries_unchanged,
                "images": report.images,
                "gallery_entries": report.gallery_entries,
                "warnings": len(report.warnings),
            }
        )
    )


def ensure_postgres_database(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[-1]
    admin = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')


def run_child(step: str, database_url: str, var_dir: Path, paths: list[Path], fmt: str = "cirr") -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        step,
        "--format",
        fmt,
        "--database-url",
        database_url,
        "--var-dir",
        str(var_dir),
        *map(str, paths),
    ]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def measure(n: int, scratch: Path, base_url: str | None, write, fmt: str = "cirr") -> dict:
    """Fresh import then re-import of the files ``write(folder)`` makes, in a new database."""
    var_dir = scratch / f"{fmt}{n}"
    var_dir.mkdir()
    paths = write(var_dir)
    if base_url:
        url = f"{base_url}_{fmt}_{n}"
        ensure_postgres_database(url)
    else:
        url = f"sqlite:///{var_dir / 'bench.sqlite3'}"
    run_child("migrate", url, var_dir, [])
    fresh = run_child("import", url, var_dir, paths, fmt)
    again = run_child("import", url, var_dir, paths, fmt)
    return {"n": n, "bytes": sum(p.stat().st_size for p in paths), "fresh": fresh, "again": again}


def run_case(title: str, unit: str, sizes: list[int], scratch: Path, base_url: str | None, write, fmt: str) -> None:
    """Measure every size of one case and print its table and goals."""
    print(f"{title}", flush=True)
    print(
        f"{unit:>8} {'file MB':>8} {'fresh s':>8} {'cpu s':>7} {'fresh RSS MB':>13} {'re-import s':>12} "
        f"{'cpu s':>7} {'re RSS MB':>10} {'re/fresh':>9} {'(cpu)':>6}",
        flush=True,
    )
    rows = []
    for n in sizes:
        row = measure(n, scratch, base_url, lambda folder, n=n: write(folder, n), fmt)
        rows.append(row)
        fresh, again = row["fresh"], row["again"]
        print(
            f"{n:>8} {row['bytes'] / 1e6:>8.1f} {fresh['seconds']:>8.2f} {fresh['cpu_seconds']:>7.2f} "
            f"{fresh['peak_rss_kib'] / 1024:>13.1f} {again['seconds']:>12.2f} {again['cpu_seconds']:>7.2f} "
            f"{again['peak_rss_kib'] / 1024:>10.1f} {again['seconds'] / fresh['seconds']:>9.2f} "
            f"{again['cpu_seconds'] / fresh['cpu_seconds']:>6.2f}   ({fresh['queries']} queries, "
            f"{fresh['images']} images, {fresh['gallery_entries']} gallery entries; "
            f"re-import: {again['unchanged']} unchanged)",
            flush=True,
        )
    if len(rows) >= 2:
        small, large = rows[0], rows[-1]
        peak = max(large["fresh"]["peak_rss_kib"], large["again"]["peak_rss_kib"])
        base = max(small["fresh"]["peak_rss_kib"], small["again"]["peak_rss_kib"])
        print(f"peak RSS at {large['n']} / at {small['n']}: {peak / base:.2f} (goal <= 1.5)")
        worst = max(r["again"]["seconds"] / r["fresh"]["seconds"] for r in rows)
        worst_cpu = max(r["again"]["cpu_seconds"] / r["fresh"]["cpu_seconds"] for r in rows)
        print(f"worst re-import / fresh time: {worst:.2f} wall, {worst_cpu:.2f} CPU (goal <= 1.2)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=["cirr", "mbeir", "all"], default="cirr")
    parser.add_argument("--sizes", default="4000,67000", help="cirr: numbers of queries.")
    parser.add_argument("--no-ext", action="store_true", help="cirr: leave out the cap.ext file.")
    parser.add_argument("--pools", default="20000,200000", help="mbeir: numbers of candidate-pool lines.")
    parser.add_argument("--pool-queries", type=int, default=4000, help="mbeir: number of queries (fixed).")
    parser.add_argument("--database-url", default=None, help="PostgreSQL base URL (one database per size).")
    parser.add_argument("--keep", action="store_true", help="Keep the scratch folder.")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--format", default="cirr", help=argparse.SUPPRESS)
    parser.add_argument("--var-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("paths", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        setup_django(args.database_url, args.var_dir)
        child(args.child, args.format, args.paths)
        return

    scratch = Path(tempfile.mkdtemp(prefix="cirval-bench-import-"))
    try:
        if args.case in ("cirr", "all"):
            run_case(
                "CIRR rc2 files, growing the queries",
                "queries",
                [int(x) for x in args.sizes.split(",")],
                scratch,
                args.database_url,
                lambda folder, n: write_files(folder, n, not args.no_ext),
                "cirr",
            )
        if args.case in ("mbeir", "all"):
            run_case(
                f"M-BEIR, growing the candidate pool ({args.pool_queries} queries)",
                "pool",
                [int(x) for x in args.pools.split(",")],
                scratch,
                args.database_url,
                lambda folder, n: write_mbeir_files(folder, n, args.pool_queries),
                "mbeir",
            )
    finally:
        if args.keep:
            print(f"scratch kept in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
