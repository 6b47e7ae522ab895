"""python manage.py create_study --name N --dataset D [--dataset D2] [options]"""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from annotation.core.rubric import builtin_rubrics
from annotation.studies.building import StudyError, StudySpec, create_study


class Command(BaseCommand):
    help = "Create an annotation study: item pool (filtered, stratified, seeded), overlap, annotators."

    def add_arguments(self, parser):
        parser.add_argument("--name", required=True)
        parser.add_argument("--dataset", action="append", required=True, dest="datasets")
        parser.add_argument("--rubric", default="validity", choices=sorted(builtin_rubrics()))
        parser.add_argument("--overlap", type=int, default=3)
        parser.add_argument(
            "--quorum",
            type=int,
            default=None,
            help="Current judgements before an item is decided (default: the overlap).",
        )
        parser.add_argument(
            "--session-reject",
            choices=["majority", "any"],
            default=None,
            help="Session rubrics: reject on a majority of reject flags (default) or on any.",
        )
        parser.add_argument(
            "--session-threshold",
            type=float,
            default=None,
            help="Session rubrics: validate when the median overall score is at least this (default 3).",
        )
        parser.add_argument(
            "--hidden-category",
            action="append",
            default=[],
            dest="hidden_categories",
            help="Keep only queries with this audit label (repeatable).",
        )
        parser.add_argument(
            "--quota",
            action="append",
            default=[],
            help="DATASET::CATEGORY=N: items to draw from one stratum (repeatable).",
        )
        parser.add_argument("--total", type=int, default=None, help="Items to draw, split over strata by size.")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--agreement-size", type=int, default=0, help="Items judged by every annotator.")
        parser.add_argument("--not-blind", action="store_true", help="Show audit ranks to annotators.")
        parser.add_argument("--guidelines", default="")
        parser.add_argument("--lease-minutes", type=int, default=10)
        parser.add_argument("--annotator", action="append", default=[], dest="annotators")
        parser.add_argument(
            "--estimate",
            type=float,
            default=None,
            metavar="HALF_WIDTH",
            help="An estimate study: sample the pool by suspicion strata (Neyman plan) and estimate "
            "each defect kind's prevalence; stop serving once the overall rate's 95%% interval "
            "has this half-width (e.g. 0.03).",
        )
        parser.add_argument("--estimate-strata", type=int, default=4, help="Suspicion strata of an estimate study.")
        parser.add_argument(
            "--estimate-reallocate",
            action="store_true",
            help="Re-plan an estimate study's allocation from the observed rates (fewer items on a "
            "large benchmark; its intervals lean low where strata are sampled nearly in full).",
        )
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **o):
        quotas = None
        if o["quota"]:
            quotas = {}
            for q in o["quota"]:
                key, sep, n = q.rpartition("=")
                if not sep or not n.isdigit():
                    raise CommandError(f"--quota {q!r}: use DATASET::CATEGORY=N")
                quotas[key] = int(n)
        spec = StudySpec(
            name=o["name"],
            datasets=o["datasets"],
            rubric=o["rubric"],
            overlap=o["overlap"],
            hidden_categories=o["hidden_categories"],
            quotas=quotas,
            total=o["total"],
            seed=o["seed"],
            agreement_size=o["agreement_size"],
            blind=not o["not_blind"],
            guidelines=o["guidelines"],
            lease_minutes=o["lease_minutes"],
            annotators=o["annotators"],
            quorum=o["quorum"],
            session_rule=_session_rule(o),
            estimate=None
            if o["estimate"] is None
            else {
                "target_half_width": o["estimate"],
                "strata": o["estimate_strata"],
                "reallocate": o["estimate_reallocate"],
            },
        )
        try:
            study, report = create_study(spec)
        except (StudyError, ValueError) as exc:
            raise CommandError(str(exc)) from None
        report["panels"] = fill_panels(study.pk)
        if o["json"]:
            self.stdout.write(json.dumps({"id": study.pk, **report}))
        else:
            self.stdout.write(
                f"Study {study.pk} {study.name!r}: {report['items']} items, overlap {study.overlap}, "
                f"quorum {study.decision_quorum}, "
                f"{report['agreement']} in the agreement subset, {len(spec.annotators)} annotators; "
                f"{report['panels']} candidate panels stored."
            )


def fill_panels(study_id: int) -> int:
    """Store the candidate panel of every single-turn item here, as ``run_audit --eager`` runs
    without a worker: the web tier serves an item only once its panel is stored
    (:func:`annotation.assignment.queue.served_pool`), so a study made on the command line is
    complete without one. The suspicion scores follow the panels (the worker task's order)."""
    from annotation.judging.panel_fill import fill_study_candidates
    from annotation.studies.suspicion_scores import refresh_suspicion

    filled = fill_study_candidates(study_id)
    refresh_suspicion(study_id)
    return filled


def _session_rule(o: dict) -> dict | None:
    rule = {k: v for k, v in (("reject", o["session_reject"]), ("threshold", o["session_threshold"])) if v is not None}
    return rule or None
