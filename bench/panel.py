"""What the candidate panel costs per request: the annotator's item payload and a submit,
with and without ticked alternatives, in-process (SQLite in a temporary folder).

    python bench/panel.py [--items 40] [--repeat 200]

Builds a small demo world, audits it with the tiny retriever, makes a study, fills its panels
and times (median and p95, ms) item_payload() and submit() with 0 and with 3 ticks. Prints
the figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="cirval-panel-bench-"))
    os.environ.update(
        CIRVAL_VAR_DIR=str(tmp),
        DATABASE_URL=f"sqlite:///{tmp / 'db.sqlite3'}",
        DJANGO_SETTINGS_MODULE="config.settings",
        IMAGE_ROOTS=str(tmp / "images"),
    )
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from annotation.assignment import queue as engine
    from annotation.judging.panel_fill import fill_study_candidates
    from annotation.judging.payloads import candidate_refs, item_payload
    from annotation.studies.building import StudySpec, create_study
    from audit.runs import dispatch, planning
    from retrieval.demo import build_demo
    from retrieval.loader import load_parsed

    call_command("migrate", verbosity=0)
    root = tmp / "images" / "demo"
    load_parsed(build_demo(root, n_gallery=120, n_single=args.items, n_sessions=1), "demo", images_root=root)
    dispatch.run_inline(planning.create_run("demo", ["openclip:cirval-tiny-vit"]))
    user = get_user_model().objects.create_user("bench", password="x")
    study, _ = create_study(StudySpec(name="bench", datasets=["demo"], overlap=1, annotators=["bench"]))
    t0 = time.perf_counter()
    fill_study_candidates(study.pk)
    fill_s = time.perf_counter() - t0
    asg = engine.next_assignment(study, user).assignment
    panel = list(asg.item.candidates)
    timings: dict[str, list[float]] = {
        "item_payload": [],
        "of which panel": [],
        "submit, no ticks": [],
        "submit, 3 ticks": [],
    }
    for n in range(args.repeat):
        t = time.perf_counter()
        item_payload(asg)
        timings["item_payload"].append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        candidate_refs(asg.item)
        timings["of which panel"].append((time.perf_counter() - t) * 1000)
        for name, ticks in (("submit, no ticks", []), ("submit, 3 ticks", panel[n % 5 : n % 5 + 3])):
            t = time.perf_counter()
            engine.submit(asg, {"category": "VALIDATED", "time_spent_ms": 5, "alternatives": ticks})
            timings[name].append((time.perf_counter() - t) * 1000)
    print(f"panels of {study.candidates} filled for {study.items.count()} items in {fill_s:.2f} s")
    for name, ms in timings.items():
        print(f"{name:18} median {pct(ms, 0.5):6.2f} ms   p95 {pct(ms, 0.95):6.2f} ms   (n={len(ms)})")
    print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
