"""python manage.py export_validated --study ID [--out DIR] [--policy majority|unanimous|primary|reliability]
[--primary USER] [--chunk-size N] [--format mbeir|circo] [--sessions whole|prefix]

Writes the validated export of a study (M-BEIR query JSONL per dataset and hidden category, or
CIRCLED session JSON for session studies; trace JSONL, manifest with SHA-256 and the counts of
validated, rejected, adjudicated and pending items; see :mod:`annotation.export.validated`) into ``DIR`` (created; it
must be absent or empty), by default ``EXPORT_DIR/<study>-<timestamp>/``, and refreshes each
dataset's ``validated`` query subset. Runs in this process; the study page runs the same
export on a worker.
"""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand, CommandError

from annotation.agreement.reports import get_study
from annotation.alternatives.export import FORMATS
from annotation.core.consensus import POLICIES
from annotation.export.validated import SESSION_SCOPES, ExportError, export_study


class Command(BaseCommand):
    help = "Export the validated items of a study as M-BEIR JSONL with trace and manifest."

    def add_arguments(self, parser):
        parser.add_argument("--study", required=True, help="Study id.")
        parser.add_argument("--out", default=None, help="Export folder (absent or empty); default under EXPORT_DIR.")
        parser.add_argument(
            "--policy",
            choices=POLICIES,
            default=None,
            help="Consensus policy (default: the study's own, Study.consensus, as the export page preselects).",
        )
        parser.add_argument("--primary", default=None, help="Deciding annotator of the primary policy (a username).")
        parser.add_argument("--chunk-size", type=int, default=1000, help="Items read per batch (default 1000).")
        parser.add_argument(
            "--sessions",
            choices=SESSION_SCOPES,
            default="whole",
            help="Session studies judged turn by turn: whole valid sessions (default) or valid "
            "prefixes too (each decided session cut after its last leading valid turn).",
        )
        parser.add_argument(
            "--format",
            choices=FORMATS,
            default="mbeir",
            help="Query files: M-BEIR JSONL (default) or CIRCO's annotation layout (gt_img_ids).",
        )

    def handle(self, *args, **opts):
        if opts["chunk_size"] < 1:
            raise CommandError("--chunk-size must be at least 1")
        study = get_study(opts["study"])
        opts["policy"] = opts["policy"] or study.consensus
        if opts["primary"] and opts["policy"] != "primary":
            raise CommandError("--primary needs --policy primary")
        started = time.perf_counter()
        last = [0.0]

        def progress(stage: str, done: int, total: int) -> None:
            now = time.perf_counter()
            if opts["verbosity"] >= 2 and (now - last[0] > 2 or done == total):
                last[0] = now
                self.stderr.write(f"{stage}: {done} / {total} items")

        try:
            result = export_study(
                study,
                opts["out"],
                policy=opts["policy"],
                primary=opts["primary"],
                chunk_size=opts["chunk_size"],
                progress=progress,
                fmt=opts["format"],
                sessions=opts["sessions"],
            )
        except (ExportError, OSError) as exc:
            raise CommandError(str(exc)) from None
        counts = result.manifest["counts"]
        self.stdout.write(
            f"Exported study {study.pk} ({study.name!r}, policy {opts['policy']}) to {result.path} in "
            f"{time.perf_counter() - started:.1f} s: {counts['validated']} validated of {counts['items']} items "
            f"({counts['rejected']} rejected, {counts['adjudicated']} decided by an adjudicator, "
            f"{counts['awaiting_adjudication']} waiting for adjudication, {counts['pending']} pending below the "
            f"quorum of {result.manifest['consensus']['quorum']}, {counts['unjudged']} unjudged)."
        )
        for f in result.manifest["files"]:
            self.stdout.write(f"  {f['path']}  {f['lines']} lines  sha256 {f['sha256']}")
        left_out = result.manifest.get("left_out")
        if left_out:
            shown = ", ".join(left_out["qids"][:10]) + (" …" if left_out["queries"] > 10 else "")
            self.stdout.write(
                self.style.WARNING(
                    f"{left_out['queries']} validated quer{'y' if left_out['queries'] == 1 else 'ies'} left out of the "
                    f"M-BEIR files ({shown}): {left_out['reason']}."
                )
            )
