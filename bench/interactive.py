"""Re-ranking time per round of an interactive study on the demo world (issue 26, item 4).

    python bench/interactive.py [--sessions 6] [--rounds 5] [--database-url sqlite:///var/bench/interactive.sqlite3]

Draws the demo world (``make_demo``, once: it trains the demo retrievers, minutes, and reuses
them afterwards) into its own database; its ``demo-interactive`` study re-ranks with the demo's
trained retriever (the audit's first). An annotator then writes ``--sessions`` sessions of
``--rounds`` rounds each (picking a result as the next round's reference), and every round is
ranked by :func:`annotation.interactive.service.rank_round`, the worker task's own code, in
this process with the torch threads a worker on this machine would get
(``config.worker_tuning.torch_threads``); a session stops as the study's rule says (top N = 10,
R = ``--rounds``). Prints the first round (the model built, the gallery
matrix mapped; torch is imported already) apart from the warm rounds (median, p95, max), the gallery size, and the
machine's load (``uptime``). Target: under 1 s per round on 2 CPU cores. Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from io import StringIO
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TEXTS = [
    "make it blue",
    "add a second shape",
    "the shapes should be smaller",
    "use a green background",
    "remove the star",
    "more shapes, all red",
    "make the circle bigger",
    "fewer shapes",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", f"sqlite:///{ROOT / 'var' / 'bench' / 'interactive.sqlite3'}"),
    )
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "bench"))
    from pgdb import setup_django

    setup_django(args.database_url, ROOT)
    import torch
    from django.conf import settings
    from django.core.management import call_command

    from annotation.assignment import queue as engine
    from annotation.interactive import service
    from annotation.models import InteractiveSession, Study
    from audit.runs.encoding import clear_memos
    from config.worker_tuning import torch_threads

    threads = torch_threads(os.cpu_count() or 1, int(settings.WORKER_RESERVED_CORES), 1)
    torch.set_num_threads(threads)
    call_command("migrate", verbosity=0)
    if not Study.objects.filter(name="demo-interactive").exists():
        print("drawing and auditing the demo world (make_demo) …", flush=True)
        call_command("make_demo", stdout=StringIO())
    study = Study.objects.get(name="demo-interactive")
    study.interactive = {**study.interactive, "max_rounds": args.rounds}
    study.save(update_fields=["interactive"])
    InteractiveSession.objects.filter(study=study).delete()
    study.assignments.all().delete()
    study.items.update(taken=0, completed=0)
    service.send_task = lambda name, pk: True  # the bench runs the worker's code itself
    clear_memos()  # the first round builds the model and maps the gallery, as a fresh worker's does
    user = study.annotators.order_by("username").first()
    first_ms: float | None = None
    nonce = time.time_ns()
    warm: list[float] = []
    gallery = 0
    for s in range(args.sessions):
        served = engine.next_assignment(study, user).assignment
        if served is None:
            break
        session = service.session_for(served)
        gallery = served.item.query.dataset.gallery.count()
        for r in range(args.rounds):
            shown = list(session.rounds.order_by("-index").values_list("shown", flat=True)[:1])
            reference = shown[0][min(r, len(shown[0]) - 1)] if shown else None
            # a text no earlier run wrote, so that it is encoded, as a person's new feedback is
            rnd = service.submit_round(session, TEXTS[(s + r) % len(TEXTS)] + f" ({nonce}.{s}.{r})", reference)
            started = time.perf_counter()
            service.rank_round(rnd.pk)
            took = (time.perf_counter() - started) * 1000
            if first_ms is None:
                first_ms = took
            else:
                warm.append(took)
            session.refresh_from_db()
            if session.outcome:
                break
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"retriever: {study.interactive['retriever']}")
    print(f"gallery: {gallery} images; torch threads: {threads}; cores: {os.cpu_count()}")
    print(f"first round (builds the model, maps the gallery; torch already imported): {first_ms:.0f} ms")
    if warm:
        warm.sort()
        p95 = warm[min(len(warm) - 1, int(round(0.95 * (len(warm) - 1))))]
        print(
            f"warm rounds: {len(warm)}; median {statistics.median(warm):.1f} ms, p95 {p95:.1f} ms, "
            f"max {warm[-1]:.1f} ms (whole task: history read, encode the new text and reference, rank, store)"
        )
    print(f"load: {load}")


if __name__ == "__main__":
    main()
