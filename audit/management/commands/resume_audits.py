"""python manage.py resume_audits: resend stale chunks of unfinished audits (after a crash)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from audit.models import AuditRun
from audit.runs import dispatch

from .run_audit import wait_for_run


class Command(BaseCommand):
    help = (
        "Reconcile unfinished audits: chunks whose worker died (stale lease) or whose message was lost are "
        "sent again and coordination restarts. With --retry-failed, failed chunks of the given runs are reset."
    )

    def add_arguments(self, parser):
        parser.add_argument("runs", nargs="*", type=int, help="Run ids (default: every unfinished run).")
        parser.add_argument("--retry-failed", action="store_true", help="Also restart failed runs given by id.")
        parser.add_argument("--wait", action="store_true", help="Wait for the given runs to end, showing progress.")

    def handle(self, *args, **opts):
        ids = opts["runs"] or list(
            AuditRun.objects.filter(
                status__in=[AuditRun.Status.QUEUED, AuditRun.Status.RUNNING], source=AuditRun.Source.COMPUTED
            ).values_list("pk", flat=True)
        )
        if not ids:
            self.stdout.write("No unfinished audits.")
            return
        for pk in ids:
            run = AuditRun.objects.filter(pk=pk).first()
            if run is None:
                raise CommandError(f"no audit {pk}")
            if run.status == AuditRun.Status.FAILED and opts["retry_failed"]:
                n = dispatch.retry_failed(run)
                self.stdout.write(f"audit {pk}: {n} failed chunk(s) reset")
            result = dispatch.reconcile(pk, takeover=True)
            self.stdout.write(f"audit {pk}: " + ", ".join(f"{k} {v}" for k, v in result.items()))
        if opts["wait"]:
            for pk in ids:
                run = wait_for_run(pk, self.stderr)
                self.stdout.write(f"audit {pk}: {run.status}")
