"""python manage.py run_audit: start a shortcut audit (queued for the workers, or in-process)."""

from __future__ import annotations

import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from audit.labels import count_lines
from audit.models import AuditRun
from audit.protocol import gallery_mixed_warning
from audit.runs import dispatch, planning
from config.figures import fixed
from retrieval.captions import CAPTION_JOINS
from retrieval.jobs.job_progress import format_eta
from retrieval.retrievers import MODALITY_RULES


def _f(v: float | None) -> str:
    return "undefined" if v is None else fixed(v, 3)


def progress_line(run: AuditRun) -> str:
    eta = run.live_eta_seconds() if run.status == AuditRun.Status.RUNNING else None
    return f"audit {run.pk}: {run.status} {run.stage} {run.done}/{run.total} ({run.percent}%) ETA {format_eta(eta)}"


class Command(BaseCommand):
    help = (
        "Audit a dataset split with a pool of retrievers (multimodal, text-only and image-only ranks, "
        "then shortcut labels; multi-turn sessions are ranked turn by turn and filtered as in CIRCLED). Without --wait the run is queued for the workers "
        "(celery -A config worker -Q gpu) and its id printed."
    )

    def add_arguments(self, parser):
        parser.add_argument("--dataset", required=True)
        parser.add_argument(
            "--split",
            default="",
            help="A split (val), a category of one (dress/val) or a category of the only split "
            "(dress). Default: the dataset's only split.",
        )
        parser.add_argument(
            "--retriever",
            action="append",
            required=True,
            dest="retrievers",
            help="Retriever spec, e.g. openclip:cirval-tiny-vit (repeat for a pool).",
        )
        parser.add_argument("--k", type=int, default=10)
        parser.add_argument("--min-mm-retrievers", type=int, default=1)
        parser.add_argument(
            "--keep-reference",
            action="store_true",
            help="Keep each query's reference image in its gallery (default: excluded).",
        )
        parser.add_argument(
            "--epsilon", type=float, default=None, help="Sessions: epsilon-consistency margin (default 30)."
        )
        parser.add_argument(
            "--tau", type=float, default=None, help="Sessions: tau-diversity cosine threshold (default 0.8)."
        )
        parser.add_argument(
            "--tau-encoder",
            default=None,
            help="Sessions: retriever spec whose text encoder tau uses (default: the first --retriever).",
        )
        parser.add_argument(
            "--caption-join",
            choices=sorted(CAPTION_JOINS),
            default="cirval",
            help="How a turn's captions become one text: cirval (default: stripped, joined with "
            "' and ') or clip4cir (CLIP4Cir's FashionIQ validation text); retrieval/captions.py.",
        )
        parser.add_argument(
            "--modality-rule",
            choices=sorted(MODALITY_RULES),
            default=None,
            help="How the text-only and image-only queries are formed: each retriever family's own "
            "(family) or CIRCUS's (circus: the text with a black image, the image with the "
            "empty text). Default: the AUDIT_MODALITY_RULE setting. Recorded on the run.",
        )
        parser.add_argument("--chunk-queries", type=int, default=None)
        parser.add_argument("--chunk-gallery", type=int, default=None)
        parser.add_argument("--wait", action="store_true", help="Show progress until done, then the label counts.")
        parser.add_argument("--eager", action="store_true", help="Run in this process (no worker needed).")
        parser.add_argument("--poll", type=float, default=2.0, help="Seconds between progress checks with --wait.")
        parser.add_argument(
            "--max-cost",
            type=float,
            default=None,
            help="Refuse the run when the hosted (api:) retrievers' estimated cost, in US dollars, "
            "is over this (the estimate is printed before every run that has one).",
        )

    def handle(self, *args, **opts):
        self.check_cost(opts)
        try:
            run = planning.create_run(
                opts["dataset"],
                opts["retrievers"],
                split=opts["split"] or None,
                k=opts["k"],
                min_mm_retrievers=opts["min_mm_retrievers"],
                exclude_reference=not opts["keep_reference"],
                chunk_queries=opts["chunk_queries"],
                chunk_gallery=opts["chunk_gallery"],
                epsilon=opts["epsilon"],
                tau=opts["tau"],
                tau_encoder=opts["tau_encoder"],
                caption_join=opts["caption_join"],
                modality_rule=self.modality_rule(opts),
            )
        except ValueError as exc:  # AuditError and bad retriever specs
            raise CommandError(str(exc)) from None
        if opts["eager"]:
            last = [0.0]

            def progress(r: AuditRun) -> None:
                if opts["wait"] or time.monotonic() - last[0] > 1:
                    last[0] = time.monotonic()
                    self.stderr.write(progress_line(r))

            run = dispatch.run_inline(run, progress=progress)
        else:
            dispatch.kick_coordinator(run.pk)
            self.stdout.write(
                f"Audit {run.pk} queued: {run.dataset.name}:{run.split}, {len(run.retrievers)} retriever(s)."
            )
            self.stdout.write(f"Watch it at /audits/{run.pk}/ or with: python manage.py resume_audits --wait {run.pk}")
            if not opts["wait"]:
                return
            run = wait_for_run(run.pk, self.stderr, poll=opts["poll"])
        self.report(run)

    @staticmethod
    def modality_rule(opts) -> str:
        return opts["modality_rule"] or settings.AUDIT_MODALITY_RULE

    def check_cost(self, opts) -> None:
        """Print the api: retrievers' estimated calls and cost; refuse (before anything is
        written) a run over --max-cost."""
        from retrieval.retrievers.api.budget import audit_estimates, refusal

        try:
            estimates = audit_estimates(
                opts["dataset"],
                opts["split"] or None,
                opts["retrievers"],
                planning.resolve_split,
                caption_join=opts["caption_join"],
                modality_rule=self.modality_rule(opts),
                cache_root=settings.EMBEDDING_CACHE_DIR,
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        for estimate in estimates:
            self.stdout.write(f"cost estimate: {estimate.line()}")
        if (why := refusal(estimates, opts["max_cost"])) is not None:
            raise CommandError(why)

    def report(self, run: AuditRun) -> None:
        if run.status != AuditRun.Status.DONE:
            raise CommandError(f"audit {run.pk} {run.status}: {run.error or run.stage}")
        s = run.summary
        skipped = ", ".join(f"{r} {n}" for r, n in s.get("skipped", {}).items()) or "none"
        self.stdout.write(f"Audit {run.pk} done: {s.get('n_queries', 0)} queries labelled; skipped: {skipped}.")
        for line in count_lines(s.get("counts", {})):
            self.stdout.write(line)
        for warning in run_warnings(run):
            self.stderr.write(f"warning: {warning}")
        ses = s.get("sessions")
        if ses:
            sk = ", ".join(f"{r} {n}" for r, n in ses.get("skipped", {}).items()) or "none"
            self.stdout.write(f"Sessions: {ses['n_sessions']} scored; skipped: {sk}.")
            basis = ses.get("filter_basis", {})
            self.stdout.write(
                f"  filters on {basis.get('retriever')} {basis.get('modality')} {basis.get('strategy')}"
                f" (K {ses['k']}, epsilon {ses['epsilon']:g}, tau {ses['tau']:g}):"
            )
            for step in ses.get("filters", {}).get("steps", []):
                self.stdout.write(
                    f"  {step['name']:<22}removed {step['removed']:>6} (alone {step['removed_alone']})"
                    f"  remaining {step['remaining']:>6}"
                )
            for name, per in ses.get("metrics", {}).items():
                for strategy, mods in per.items():
                    cells = "  ".join(
                        f"{m} R@{ses['k']} {_f(v.get('final_recall_at_k'))} AUC {_f(v.get('auc'))}"
                        for m, v in mods.items()
                    )
                    self.stdout.write(f"  {name} {strategy}: {cells}")


def run_warnings(run: AuditRun) -> list[str]:
    """What the audit page warns of, for the terminal: ground truths outside the gallery (those
    queries are labelled unresolved and ranked as misses), galleries that mix scopes."""
    s = run.summary or {}
    out = []
    if s.get("no_positive_in_gallery"):
        out.append(
            f"{s['no_positive_in_gallery']} queries had no ground truth in the gallery they searched "
            f"(labelled unresolved, ranked as misses)"
        )
    if (s.get("sessions") or {}).get("no_positive_in_gallery"):
        out.append(
            f"{s['sessions']['no_positive_in_gallery']} sessions had no ground truth in the gallery they searched"
        )
    if mixed := gallery_mixed_warning(run):
        out.append(mixed)
    return out


def wait_for_run(run_id: int, err, poll: float = 2.0) -> AuditRun:
    """Poll a run until it ends, reconciling on every check; progress goes to ``err``."""
    tty = getattr(err, "isatty", lambda: False)()
    while True:
        dispatch.reconcile(run_id)
        run = AuditRun.objects.get(pk=run_id)
        line = progress_line(run)
        if tty:
            err.write("\r" + line, ending="")
            err.flush()
        else:
            err.write(line)
        if not run.is_active:
            if tty:
                err.write("")
            return run
        time.sleep(poll)
