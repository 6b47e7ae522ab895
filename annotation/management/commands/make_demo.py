"""python manage.py make_demo: a deterministic synthetic CIR world plus demo accounts."""

from __future__ import annotations

import json
import time
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from annotation.demo_accounts import ensure_demo_accounts
from annotation.judging.panel_fill import fill_study_candidates
from annotation.models import Study
from annotation.studies.building import StudySpec, create_study
from annotation.studies.suspicion_scores import refresh_suspicion
from annotation.studies.truth import truth_path
from audit.labels import SHORTCUT_FREE_LABELS, count_lines
from audit.management.commands.run_audit import progress_line
from audit.models import AuditRun
from audit.runs.dispatch import run_inline
from audit.runs.planning import create_run
from retrieval.demo import build_demo_world
from retrieval.demo_training import retriever_spec
from retrieval.fusion import MAX_CANDIDATES
from retrieval.jobs.job_progress import ProgressLine
from retrieval.loader import load_parsed

from .train_demo_retriever import default_models_dir, default_steps, demo_checkpoints


def demo_retrievers(seed: int, train_steps: int | None = None, stdout=None, composers: bool = False) -> list[str]:
    """The specs of the two trained demo retrievers; trains the ones whose checkpoint is missing.
    ``composers``: also the demo's composers over the ``compose`` model (a Combiner and a SEARLE-
    layout textual inversion, :mod:`retrieval.demo_composers`), trained when missing."""
    paths = demo_checkpoints(default_models_dir(), seed)
    if not all(p.exists() for p in paths.values()):
        call_command(
            "train_demo_retriever", "--seed", str(seed), "--steps", str(train_steps or default_steps()), stdout=stdout
        )
    specs = [retriever_spec(p) for p in paths.values()]
    return specs + (demo_composer_specs(paths["compose"], seed, train_steps or default_steps()) if composers else [])


def demo_composer_specs(backbone, seed: int, train_steps: int | None = None) -> list[str]:
    """The demo composers' specs, trained over ``backbone`` where missing (a few steps when the
    demo retrievers are: a test's demo)."""
    from retrieval.demo_composers import DEMO_COMPOSERS, composer_path, composer_spec, train_composer

    short = train_steps is not None and train_steps < 20
    out = []
    for name in DEMO_COMPOSERS:
        path = composer_path(backbone, name)
        if not path.exists():
            train_composer(path, name, backbone, seed=seed, **({"steps": 2, "n_refs": 8} if short else {}))
        out.append(composer_spec(path))
    return out


class Command(BaseCommand):
    help = "Build the demo dataset (Pillow scenes, single-turn queries, multi-turn sessions) and demo accounts."

    def add_arguments(self, parser):
        parser.add_argument("--name", default="demo")
        parser.add_argument("--seed", type=int, default=7)
        parser.add_argument("--no-audit", action="store_true", help="Skip the shortcut audit of the demo queries.")
        parser.add_argument(
            "--composers",
            action="store_true",
            help="Audit with the demo's composers too (a Combiner and a textual inversion over the "
            "compose model, trained in seconds when missing).",
        )
        parser.add_argument(
            "--train-steps",
            type=int,
            default=None,
            help="Steps when the demo retrievers must be trained (an existing checkpoint is reused).",
        )
        parser.add_argument(
            "--images-dir", default=None, help="Where the PNGs go (default: the first IMAGE_ROOTS entry + /<name>)."
        )

    def handle(self, *args, **opts):
        started = time.monotonic()
        out = Path(opts["images_dir"]) if opts["images_dir"] else Path(settings.IMAGE_ROOTS[0]) / opts["name"]
        out.mkdir(parents=True, exist_ok=True)
        self.stdout.write(f"Drawing the demo world into {out} …")
        parsed, truth = build_demo_world(out, seed=opts["seed"])
        truth_file = truth_path(opts["name"])
        truth_file.parent.mkdir(parents=True, exist_ok=True)
        truth_file.write_text(json.dumps(truth, indent=1, sort_keys=True), encoding="utf-8")
        report = load_parsed(parsed, opts["name"], images_root=out, description="Synthetic CIR world (make_demo)")
        self.stdout.write(
            f"Dataset {report.dataset!r}: {report.images} images, {report.single_turn} single-turn queries, "
            f"{report.multi_turn} multi-turn sessions, {report.targets} targets"
            f" ({report.missing_images} missing images)."
        )
        if not opts["no_audit"] and not AuditRun.objects.filter(dataset__name=opts["name"], status="done").exists():
            retrievers = demo_retrievers(
                opts["seed"], opts["train_steps"], stdout=self.stdout, composers=opts["composers"]
            )
            self.stdout.write(f"Auditing the demo queries with {', '.join(retrievers)} …")
            line = ProgressLine(self.stderr)
            run = run_inline(
                create_run(opts["name"], retrievers),
                progress=lambda r: line.update(progress_line(r), r.done / max(r.total, 1)),
            )
            line.close()
            if run.status == "done":
                self.stdout.write(f"Audit {run.pk} done: {run.summary.get('n_queries', 0)} queries labelled.")
                for text in count_lines(run.summary.get("counts", {})):
                    self.stdout.write(text)
            else:
                self.stdout.write(self.style.WARNING(f"Audit {run.pk} did not finish: {run.error}"))
        accounts = ensure_demo_accounts()
        annotators = [u for u, _, role in accounts if role == "annotator"]
        audited = AuditRun.objects.filter(dataset__name=opts["name"], status="done").exists()
        # Humans see what the audit could not rule out: the shortcut-free queries.
        pool = list(SHORTCUT_FREE_LABELS) if audited else []
        for spec in (
            StudySpec(
                name=f"{opts['name']}-validity",
                datasets=[opts["name"]],
                rubric="validity",
                overlap=3,
                hidden_categories=pool,
                agreement_size=10,
                seed=opts["seed"],
                annotators=annotators,
                candidates=MAX_CANDIDATES,  # the deepest pool: pages open only while they bring ticks
                guidelines="Judge each query with the validity rubric: read the text, look at the reference, "
                "check the target, ask whether many gallery images would fit equally well.",
            ),
            StudySpec(
                name=f"{opts['name']}-sessions",
                datasets=[opts["name"]],
                rubric="session",
                overlap=2,
                seed=opts["seed"],
                annotators=annotators,
                guidelines="Give every turn of the session a verdict (a: valid, d: invalid; the session is valid "
                "when every turn is), check every turn, then rate the session as a whole.",
            ),
            # the annotators play the user: sessions written by people (issue 26), N = 10, R = 5
            StudySpec(
                name=f"{opts['name']}-interactive",
                datasets=[opts["name"]],
                overlap=1,
                seed=opts["seed"],
                hidden_categories=pool,
                total=30,
                annotators=annotators,
                interactive={},
                guidelines="Look at the target, then tell the search engine what to change, round by "
                "round, until the target shows up among the results.",
            ),
        ):
            if not Study.objects.filter(name=spec.name).exists():
                study, info = create_study(spec)
                if spec.interactive is None:
                    fill_study_candidates(study.pk)  # the candidate panels, fixed before anyone looks
                    refresh_suspicion(study.pk)  # the suspicion scores (staff only), from the same audit
                self.stdout.write(f"Study {study.name!r}: {info['items']} items, overlap {study.overlap}.")
        self.stdout.write(self.style.SUCCESS(f"Demo ready in {time.monotonic() - started:.1f} s. Accounts:"))
        for username, password, role in accounts:
            self.stdout.write(f"  {role:<11} {username:<12} password: {password}")
