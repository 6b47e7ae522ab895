"""Time and peak memory of refusing a hostile JSON upload on the worker path.

    python bench/hostile_json.py [--depth 100000] [--database-url postgres://...]

Writes a file of ``--depth`` nested arrays (200 KB at the default 100,000 levels: the attack
that took a gunicorn worker to 22 GB through ijson) as an upload, creates the import job the
**Import** page creates, and runs the worker's task body (``retrieval.tasks.run_import``) on
it in a fresh child process (so the peak RSS, ``VmHWM``, is the child's own), after
``migrate`` has run in another child. The same file is then read as a rank file and as a
CIRCUS assignment file (the project room's imports).

Printed per case: wall seconds, the child's resident memory before, its peak (VmHWM) after,
and the job's status and message; for the import also whether the upload was deleted.
Goal: each refusal well under a second, and the peak no more than a few MB above the
resident memory before it (flat). Prints only; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def setup(var_dir: str, url: str | None) -> None:
    os.environ["CIRVAL_VAR_DIR"] = var_dir
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    if url:
        os.environ["DATABASE_URL"] = url
    import django

    django.setup()


def measure(label: str, run) -> None:
    before = status_kib("VmRSS")
    start = time.perf_counter()
    outcome = run()
    wall = time.perf_counter() - start
    peak = status_kib("VmHWM")
    print(
        f"{label:<28} {wall:8.3f} s   RSS before {before / 1024:7.1f} MB   peak {peak / 1024:7.1f} MB   "
        f"(+{(peak - before) / 1024:.1f} MB)   {outcome}",
        flush=True,
    )


def child(step: str, var_dir: str, url: str | None, depth: int) -> None:
    setup(var_dir, url)
    from django.conf import settings
    from django.core.management import call_command

    if step == "migrate":
        call_command("migrate", verbosity=0)
        return
    folder = Path(settings.UPLOAD_DIR) / "bench"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "val.json"
    path.write_text("[" * depth + "]" * depth)
    size = path.stat().st_size
    if step == "import":
        from retrieval.models import ImportJob
        from retrieval.tasks import run_import

        job = ImportJob.objects.create(dataset_name="hostile", format="circo", files=[str(path)])

        def run():
            status = run_import(job.pk)
            job.refresh_from_db()
            return f"{size} bytes: {status}, upload deleted: {not path.exists()}; {job.error.splitlines()[0][:90]}"

        measure("import job (worker task)", run)
    elif step == "ranks":
        from audit.rankfiles import RankFileError, read_rank_file

        def run():
            try:
                read_rank_file(path)
            except RankFileError as exc:
                return f"refused: {exc.message[:80]}"
            return "ACCEPTED"

        measure("rank file", run)
    elif step == "circus":
        from annotation.agreement.circus_files import CircusFormatError, parse_assignment_file

        def run():
            try:
                parse_assignment_file(path)
            except CircusFormatError as exc:
                return f"refused: {exc.message[:80]}"
            return "ACCEPTED"

        measure("CIRCUS assignment file", run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depth", type=int, default=100_000)
    parser.add_argument("--database-url", default=None, help="default: a scratch SQLite database")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--var-dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.var_dir, args.database_url, args.depth)
        return
    with tempfile.TemporaryDirectory(prefix="cirval-hostile-") as var_dir:
        print(json.dumps({"depth": args.depth, "bytes": 2 * args.depth}))
        for step in ("migrate", "import", "ranks", "circus"):
            cmd = [sys.executable, __file__, "--child", step, "--var-dir", var_dir, "--depth", str(args.depth)]
            if args.database_url:
                cmd += ["--database-url", args.database_url]
            subprocess.run(cmd, check=True, cwd=ROOT)


if __name__ == "__main__":
    main()
