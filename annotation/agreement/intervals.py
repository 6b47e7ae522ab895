"""The agreement report's bootstrap intervals, computed on a worker, never in a request.

The page, report.json and report.csv compute their point figures in the request (no bootstrap:
:func:`annotation.agreement.reports.study_report` with ``n_boot=0``) and take the intervals
from the store here (:func:`attach_intervals`). Each stored block is the ``confidence_intervals``
of :func:`annotation.agreement.reports.study_agreement` (the one agreement engine, so the figures
are those of ``manage.py agreement --study``) for one set of options (dimension, replicates,
seed, constant-pair convention), stored with the study's fingerprint
(:func:`annotation.verdicts.state.study_version`) read before it was computed. A block whose
fingerprint is not the study's current one is never shown: the report says the intervals are
being updated (``intervals_state``: ``current``, ``updating`` or ``off`` for ``bootstrap=0``).

Scheduling follows the reliability refit (:mod:`annotation.verdicts.refit`): at most one task
(:data:`INTERVALS_TASK`, queue ``celery``) pending or running per study and options, taken by an
atomic flag (a file created with ``O_EXCL``, holding when the task is due) and cleared when the
task ends; a flag older than :data:`PENDING_STALE_SECONDS` counts as lost with its worker. A submit
asks once it commits (:func:`request_after_submit`), with a countdown of
:data:`DEBOUNCE_SECONDS`, so a burst of submits makes one task; a page that finds the intervals
stale asks for them now, bringing a delayed task forward. The task asks again when judgements came
while it ran. The store is a folder of the shared ``VAR_DIR`` (as exports are), so the web tier and
the worker read the same files; a block is written to a temporary name and renamed (atomic).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from django.conf import settings

from annotation.models import Study

INTERVALS_TASK = "annotation.agreement_intervals"

#: A submit's request waits this long before the task runs: the judgements of a burst are
#: resampled once (the page asks at once when someone is looking).
DEBOUNCE_SECONDS = 30

#: A flag this old whose task has not ended is taken as lost (its worker died, its message was dropped).
PENDING_STALE_SECONDS = 600

CURRENT, UPDATING, OFF = "current", "updating", "off"


def interval_options(
    study: Study,
    *,
    dimension: str | None = None,
    n_boot: int | None = None,
    seed: int = 0,
    constant_pairs: str = "undefined",
) -> dict[str, Any]:
    """The options a block of intervals is computed for (the defaults of the page: the rubric's
    default dimension, :func:`~annotation.agreement.reports.default_bootstrap` replicates, seed 0)."""
    from annotation.agreement.reports import check_dimension, default_bootstrap

    return {
        "dimension": check_dimension(study.rubric.rubric, dimension),
        "n_boot": default_bootstrap(study) if n_boot is None else int(n_boot),
        "seed": int(seed),
        "constant_pairs": constant_pairs,
    }


def _digest(options: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()[:24]


def _paths(study: Study, options: dict[str, Any]) -> tuple[Path, Path]:
    """(the stored block, the pending flag) of one study and options: the study's folder is named
    by its id and creation time, so a study made again with the same id (a new database) starts afresh."""
    folder = Path(settings.VAR_DIR) / "agreement" / f"{study.pk}-{int(study.created_at.timestamp() * 1e6)}"
    base = folder / _digest(options)
    return base.with_suffix(".json"), base.with_suffix(".pending")


def stored(study: Study, options: dict[str, Any]) -> dict[str, Any] | None:
    """The stored block of intervals (``fingerprint``, ``confidence_intervals``, ``undefined``,
    ``computed_at``, ``seconds``) or ``None``."""
    path, _ = _paths(study, options)
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def _write(study: Study, options: dict[str, Any], block: dict[str, Any]) -> None:
    path, _ = _paths(study, options)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(block, allow_nan=False))
    os.replace(tmp, path)


def _pending_due(flag: Path) -> float | None:
    """When the pending task is due (epoch seconds), ``None`` when no flag or a lost one."""
    try:
        if time.time() - flag.stat().st_mtime > PENDING_STALE_SECONDS:
            return None
        return float(flag.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return None


def _take_flag(flag: Path, due: float, bring_forward: bool) -> bool:
    """Take the study's flag for a task due at ``due``: free, lost, or (``bring_forward``) held
    by a task due later than that. ``False`` when a task due no later is pending."""
    flag.parent.mkdir(parents=True, exist_ok=True)
    pending = _pending_due(flag)
    if pending is not None and (not bring_forward or pending <= due):
        return False
    if pending is None:
        try:
            fd = os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:  # lost (stale) flag, or another process took it just now
            if _pending_due(flag) is not None:
                return False
            flag.unlink(missing_ok=True)
            return _take_flag(flag, due, bring_forward)
        with os.fdopen(fd, "w") as out:
            out.write(repr(due))
        return True
    tmp = flag.with_name(f".{flag.name}.{os.getpid()}.tmp")
    tmp.write_text(repr(due))
    os.replace(tmp, flag)  # brought forward: the delayed task finds the intervals current and stops
    return True


def request_intervals(study: Study, options: dict[str, Any], countdown: float = 0.0) -> bool:
    """Ask a worker to compute the study's intervals for ``options`` (module docstring): ``False``
    when one due no later is pending or the broker is down (the flag is then freed, so the next
    view or submit asks again)."""
    from retrieval.jobs.sending import send_task

    if options["n_boot"] <= 0:
        return False
    _, flag = _paths(study, options)
    due = time.time() + countdown
    if not _take_flag(flag, due, bring_forward=countdown == 0):
        return False
    if send_task(INTERVALS_TASK, study.pk, options, repr(due), countdown=countdown or None):
        return True
    _release(flag, repr(due))
    return False


def request_after_submit(study: Study) -> bool:
    """After a submit commits: the study's default intervals, in :data:`DEBOUNCE_SECONDS`. Not
    with eager Celery (no worker: the page asks when it is viewed, instead of every submit
    resampling in the submitting process)."""
    from celery import current_app

    from annotation.agreement.reports import ReportError

    if current_app.conf.task_always_eager:
        return False
    try:
        options = interval_options(study)
    except ReportError:  # a rubric with nothing to report on (no scale): no report, no intervals
        return False
    return request_intervals(study, options, countdown=DEBOUNCE_SECONDS)


def _release(flag: Path, due: str) -> None:
    """Clear the flag if it is still the one of the task due at ``due`` (not brought forward since)."""
    try:
        if flag.read_text() == due:
            flag.unlink(missing_ok=True)
    except FileNotFoundError:
        pass


def compute_intervals(study: Study, options: dict[str, Any]) -> dict[str, Any]:
    """Compute and store the study's intervals for ``options`` (the task's work): the block of
    :func:`~annotation.agreement.reports.study_agreement`, with the fingerprint read before."""
    from annotation.agreement.reports import study_agreement
    from annotation.verdicts.state import study_version

    fingerprint = study_version(study)
    started = time.perf_counter()
    agreement = study_agreement(
        study,
        dimension=options["dimension"],
        n_boot=options["n_boot"],
        seed=options["seed"],
        constant_pairs=options["constant_pairs"],
    )
    prefix = "confidence_intervals."
    block = {
        "fingerprint": fingerprint,
        "options": options,
        "confidence_intervals": agreement["confidence_intervals"],
        "undefined": {k: v for k, v in agreement["undefined"].items() if k.startswith(prefix)},
        "computed_at": time.time(),
        "seconds": round(time.perf_counter() - started, 3),
    }
    _write(study, options, block)
    return block


def run_intervals(study_id: int, options: dict[str, Any], due: str | None = None) -> str:
    """The task: compute the intervals unless the stored ones are current, clear the flag, and
    ask again when the study changed while they were computed."""
    from annotation.verdicts.state import study_version

    study = Study.objects.select_related("rubric").filter(pk=study_id).first()
    if study is None:
        return "missing"
    _, flag = _paths(study, options)
    try:
        block = stored(study, options)
        if block is not None and block["fingerprint"] == study_version(study):
            return "current"
        block = compute_intervals(study, options)
    finally:
        if due is not None:
            _release(flag, due)
    if block["fingerprint"] != study_version(study):
        request_intervals(study, options, countdown=DEBOUNCE_SECONDS)
        return "computed, asked again"
    return "computed"


def attach_intervals(report: dict[str, Any], study: Study, options: dict[str, Any], fingerprint: str) -> dict[str, Any]:
    """The report (computed with ``n_boot=0``) with the stored intervals when they are current for
    ``fingerprint``, else none, ``intervals_state`` saying they are being updated, and a worker asked
    for them. Returns a new report; the one given is left as it is (it may be cached)."""
    agreement = dict(report["agreement"])
    if options["n_boot"] > 0:  # the point report's "bootstrap disabled" reasons are not this report's
        agreement["undefined"] = {
            k: v for k, v in agreement["undefined"].items() if not k.startswith("confidence_intervals.")
        }
    block = stored(study, options)
    if options["n_boot"] > 0 and (block is None or block["fingerprint"] != fingerprint):
        request_intervals(study, options)
        block = stored(study, options)  # eager Celery ran it in this process
    if options["n_boot"] <= 0:
        state = {"state": OFF}
    elif block is not None and block["fingerprint"] == fingerprint:
        agreement["confidence_intervals"] = block["confidence_intervals"]
        agreement["undefined"] = {**agreement["undefined"], **block["undefined"]}
        state = {"state": CURRENT, "computed_at": block["computed_at"], "seconds": block["seconds"]}
    else:
        ci = dict(agreement["confidence_intervals"])
        ci.update(n_boot=options["n_boot"], seed=options["seed"], intervals={})
        agreement["confidence_intervals"] = ci
        state = {"state": UPDATING}
    agreement["intervals_state"] = state
    return {**report, "agreement": agreement}
