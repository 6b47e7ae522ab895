"""Time and peak memory of importing CIRR-style files: fresh import and re-import of unchanged data.

    python bench/import.py [--sizes 4000,67000] [--no-ext] [--keep]
                           [--database-url postgres://postgres@127.0.0.1:5432/cirval_bench_import]

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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
REFERENCE = ROOT.parent / "shared" / "reference" / "datasets" / "cirr"
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
        members = [_image((i * 7 + k * 13) % n_images) for k in range(len(model.get("img_set", {}).get("members", [])) or 6)]
        reference, target = members[0], members[1]
        soft = {target: 1.0, **{m: s for m, s in zip(members[2:], [v for k, v in model["target_soft"].items()][1:])}}
        cap.append({"pairid": i, "reference": reference, "target_hard": target, "target_soft": soft,
                    "caption": f"{model['caption']} ({i})",
                    "img_set": {"id": i // 6, "members": members, "reference_rank": 0, "target_rank": 1}})
        ext.append({"pairid": i, "reference": reference, "target_hard": target,
                    "caption_extend": {str(k): f"{model['caption']} / variant {k}" for k in range(4)}})
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


def setup_django(database_url: str, var_dir: str) -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ["CIRVAL_VAR_DIR"] = var_dir
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ.setdefault("DJANGO_DEBUG", "0")  # with DEBUG on, Django keeps every query's text
    os.environ.setdefault("DJANGO_SECRET_KEY", "bench-only-not-a-secret")
    import django

    django.setup()


def peak_rss_kib() -> int:
    """Peak resident memory of this process, in KiB.

    ``VmHWM`` of /proc/self/status belongs to the memory map made at ``exec``; ru_maxrss does
    not do here: Linux carries the parent's peak into a forked child, and this parent held the
    generated files in memory.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def child(step: str, paths: list[str]) -> None:
    """Run one step in this (fresh) process and print its figures as JSON."""
    if step == "migrate":
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        return
    from retrieval.services import import_files

    before = resource.getrusage(resource.RUSAGE_SELF)
    cpu_before = before.ru_utime + before.ru_stime
    started = time.perf_counter()
    report = import_files("cirr", "bench", [Path(p) for p in paths])
    seconds = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime - cpu_before
    print(json.dumps({"seconds": seconds, "cpu_seconds": cpu, "peak_rss_kib": peak_rss_kib(), "queries": report.queries,
                      "created": report.queries_created, "unchanged": report.queries_unchanged}))


def ensure_postgres_database(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[-1]
    admin = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')


def run_child(step: str, database_url: str, var_dir: Path, paths: list[Path]) -> dict:
    cmd = [sys.executable, __file__, "--child", step, "--database-url", database_url, "--var-dir", str(var_dir),
           *map(str, paths)]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def measure(n: int, scratch: Path, base_url: str | None, with_ext: bool) -> dict:
    """Fresh import then re-import of ``n`` synthetic queries in a new database."""
    var_dir = scratch / f"n{n}"
    var_dir.mkdir()
    paths = write_files(var_dir, n, with_ext)
    if base_url:
        url = f"{base_url}_{n}"
        ensure_postgres_database(url)
    else:
        url = f"sqlite:///{var_dir / 'bench.sqlite3'}"
    run_child("migrate", url, var_dir, [])
    fresh = run_child("import", url, var_dir, paths)
    again = run_child("import", url, var_dir, paths)
    return {"n": n, "bytes": sum(p.stat().st_size for p in paths), "fresh": fresh, "again": again}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="4000,67000")
    parser.add_argument("--no-ext", action="store_true", help="Leave out the cap.ext file.")
    parser.add_argument("--database-url", default=None, help="PostgreSQL base URL (one database per size).")
    parser.add_argument("--keep", action="store_true", help="Keep the scratch folder.")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--var-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("paths", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        setup_django(args.database_url, args.var_dir)
        child(args.child, args.paths)
        return

    scratch = Path(tempfile.mkdtemp(prefix="cirval-bench-import-"))
    rows = []
    try:
        print(f"{'queries':>8} {'file MB':>8} {'fresh s':>8} {'cpu s':>7} {'fresh RSS MB':>13} {'re-import s':>12} "
              f"{'cpu s':>7} {'re RSS MB':>10} {'re/fresh':>9} {'(cpu)':>6}", flush=True)
        for n in (int(x) for x in args.sizes.split(",")):
            row = measure(n, scratch, args.database_url, not args.no_ext)
            rows.append(row)
            fresh, again = row["fresh"], row["again"]
            print(f"{n:>8} {row['bytes'] / 1e6:>8.1f} {fresh['seconds']:>8.2f} {fresh['cpu_seconds']:>7.2f} "
                  f"{fresh['peak_rss_kib'] / 1024:>13.1f} {again['seconds']:>12.2f} {again['cpu_seconds']:>7.2f} "
                  f"{again['peak_rss_kib'] / 1024:>10.1f} {again['seconds'] / fresh['seconds']:>9.2f} "
                  f"{again['cpu_seconds'] / fresh['cpu_seconds']:>6.2f}   (re-import: {again['unchanged']} unchanged)",
                  flush=True)
    finally:
        if args.keep:
            print(f"scratch kept in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    if len(rows) >= 2:
        small, large = rows[0], rows[-1]
        peak = max(large["fresh"]["peak_rss_kib"], large["again"]["peak_rss_kib"])
        base = max(small["fresh"]["peak_rss_kib"], small["again"]["peak_rss_kib"])
        print(f"peak RSS at {large['n']} / at {small['n']}: {peak / base:.2f} (goal <= 1.5)")
        worst = max(r["again"]["seconds"] / r["fresh"]["seconds"] for r in rows)
        worst_cpu = max(r["again"]["cpu_seconds"] / r["fresh"]["cpu_seconds"] for r in rows)
        print(f"worst re-import / fresh time: {worst:.2f} wall, {worst_cpu:.2f} CPU (goal <= 1.2)")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
