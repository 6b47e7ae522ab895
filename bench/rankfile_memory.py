"""Peak memory of ``import_ranks`` as a rank file's ``gallery_paths`` grows (issue 41, item 4).

    python bench/rankfile_memory.py [--sizes 10000,5000000] [--samples 2000] [--top 50]
                                    [--database-url postgres://...]

Under a temporary CIRVAL_VAR_DIR (a scratch SQLite database unless --database-url), a child
process migrates and loads a dataset of ``--samples`` queries over 4,000 images; then, for
every size, the parent writes a CIRCUS per-retriever rank file
(``retrieval_data_bench_task7_g<N>.json``, laid out as CIRCUS writes them: ``metadata``,
``summary``, ``gallery_paths``, ``samples``) whose ``gallery_paths`` lists N paths about 35
bytes long (the dataset's images among them, the rest paths the dataset does not hold), with
the same ``--samples`` samples in every file, each with its three ranks and a top list of
``--top`` indices spread over the whole gallery. So what grows is the gallery alone.

Each file is imported in a fresh child process through ``audit.imports.import_rank_files``
(what ``manage.py import_ranks`` runs), as a new audit. The parent writes the files
streaming and stays small, and reads each child's ``ru_maxrss`` with ``os.wait4`` (Linux
carries a parent's peak into a forked child, so a large parent would hide the child's own
peak); the child also prints its own ``VmHWM``, and its wall time.

Printed per size: the file's size, the import's wall seconds, ru_maxrss and VmHWM; then the
goal, peak RSS at the largest size / at the smallest <= 1.2. Prints only; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hostile_json import setup
from memory import peak_rss_kib

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
N_IMAGES = 4000
GOAL = 1.2


def image_path(n: int) -> str:
    """The path of dataset image ``n`` (what ``Image.path`` stores)."""
    return f"train/{n // 1000:02d}/img_{n:07d}.png"


def gallery_path(n: int) -> str:
    """Gallery path ``n`` of a rank file: the dataset's images first (under an absolute root
    the dataset does not know), then paths it does not hold (about 35 bytes each)."""
    if n < N_IMAGES:
        return "/data/cirr/" + image_path(n)
    return f"/data/cirr/other/{n // 1000:04d}/{n:08d}.png"


def write_rank_file(path: Path, n_gallery: int, n_samples: int, top: int, seed: int = 0) -> int:
    """Write the rank file (streaming: never more than one sample in memory); its size in bytes."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as out:
        out.write(json.dumps({"metadata": {"dataset": "bench", "task": 7, "k": 10, "retriever_name": path.stem}})[:-1])
        out.write(f', "summary": {{"n_samples": {n_samples}}}, "gallery_paths": [')
        for start in range(0, n_gallery, 100_000):
            out.write(",".join(json.dumps(gallery_path(n)) for n in range(start, min(n_gallery, start + 100_000))))
            if start + 100_000 < n_gallery:
                out.write(",")
        out.write('], "samples": [')
        for q in range(n_samples):
            target = q % N_IMAGES
            picks = [target] + [rng.randrange(n_gallery) for _ in range(top - 1)]
            rng.shuffle(picks)
            rank = picks.index(target) + 1
            sample = {
                "query_idx": q,
                "query_text": f"query {q}",
                "ranks": {"multimodal": rank, "text_only": rng.randint(1, 500), "image_only": None},
                "retrievals": {"multimodal": picks},
            }
            out.write(("," if q else "") + json.dumps(sample))
        out.write("]}")
    return path.stat().st_size


def child_dataset(n_samples: int) -> None:
    from django.core.management import call_command

    from retrieval.loader import load_parsed
    from retrieval.records import ImageRecord, ParsedDataset, QueryRecord, TargetRecord, TextRecord, TurnRecord

    call_command("migrate", verbosity=0)
    parsed = ParsedDataset(format="mbeir")
    for n in range(N_IMAGES):
        parsed.add_image(ImageRecord(external_id=f"img_{n:07d}", path=image_path(n)))
    parsed.galleries["test"] = [f"img_{n:07d}" for n in range(N_IMAGES)]
    for q in range(n_samples):
        parsed.queries.append(
            QueryRecord(
                external_id=f"q{q}",
                split="test",
                ordinal=q,
                source_file="bench_test.jsonl",
                turns=[
                    TurnRecord(index=1, reference=f"img_{(q + 1) % N_IMAGES:07d}", texts=[TextRecord(f"query {q}")])
                ],
                targets=[TargetRecord(image=f"img_{q % N_IMAGES:07d}", is_primary=True)],
                raw={"qid": q},
            )
        )
    load_parsed(parsed, "bench")


def child_import(path: str) -> None:
    from audit.imports import import_rank_files

    start = time.perf_counter()
    run, report = import_rank_files("bench", [path])
    wall = time.perf_counter() - start
    print(
        json.dumps(
            {
                "wall_s": round(wall, 2),
                "vmhwm_kib": peak_rss_kib(),
                "rows": report["rows"],
                "unmapped": report["unmapped_gallery_indices"],
                "run": run.pk,
            }
        ),
        flush=True,
    )


def run_child(args: list[str], var_dir: str, url: str | None) -> tuple[int, str]:
    """Run this script as a child; ``(ru_maxrss KiB, its stdout)`` read with ``os.wait4``."""
    cmd = [sys.executable, __file__, "--var-dir", var_dir, *args]
    if url:
        cmd += ["--database-url", url]
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, stdout=out, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode()
    if proc.returncode:
        raise SystemExit(f"child {args} failed ({proc.returncode}): {text}")
    return usage.ru_maxrss, text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,5000000", help="gallery_paths lengths (comma-separated)")
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--top", type=int, default=50)
    parser.add_argument("--database-url", default=None, help="default: a scratch SQLite database")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--var-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--file", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        setup(args.var_dir, args.database_url)
        child_dataset(args.samples) if args.child == "dataset" else child_import(args.file)
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="cirval-rankmem-") as var_dir:
        run_child(["--child", "dataset", "--samples", str(args.samples)], var_dir, args.database_url)
        peaks = {}
        for size in sizes:
            path = Path(var_dir) / f"retrieval_data_bench_task7_g{size}.json"
            nbytes = write_rank_file(path, size, args.samples, args.top)
            maxrss, text = run_child(["--child", "import", "--file", str(path)], var_dir, args.database_url)
            got = json.loads(text.strip().splitlines()[-1])
            peaks[size] = maxrss
            print(
                f"gallery_paths {size:>9,}  file {nbytes / 1e6:8.1f} MB  import {got['wall_s']:7.2f} s  "
                f"ru_maxrss {maxrss / 1024:7.1f} MB  VmHWM {got['vmhwm_kib'] / 1024:7.1f} MB  "
                f"({got['rows']} rank rows, {got['unmapped']} unmapped top-list indices)",
                flush=True,
            )
            path.unlink()
        ratio = peaks[sizes[-1]] / peaks[sizes[0]]
        print(
            f"peak RSS at {sizes[-1]:,} / at {sizes[0]:,} paths: {ratio:.3f} (goal <= {GOAL}: "
            f"{'met' if ratio <= GOAL else 'NOT met'})"
        )


if __name__ == "__main__":
    main()
