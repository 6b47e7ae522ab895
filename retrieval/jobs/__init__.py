"""One background-job framework for imports, audits and exports.

It lives in ``retrieval`` (the lowest app) so that ``audit`` and ``annotation`` can use it
without breaking the one-way imports (annotation -> audit -> retrieval).

* :mod:`.models`: the abstract models. :class:`~.models.Leased` is a unit of work a
  worker claims (status, owner, attempts, when it was sent, started, last beat and
  finished, error); :class:`~.models.Progress` is what a page shows (stage, done/total,
  percent, one JSON shape); :class:`~.models.Job` is both (``ImportJob``, ``ExportJob``).
  An audit run is a ``Progress`` whose leased units are its ``AuditChunk`` rows.
* :mod:`.leases`: the one claim (a conditional update), the heartbeat thread (a short
  beat, independent of how long the work takes), finish/fail, and the sweep rules that
  resend work whose worker died (stale heartbeat) or whose message was lost.
* :mod:`.queue`: sending a task without failing the request when the broker is down.

The sweep runs in every worker (a timer thread started at worker start, see
:func:`config.celery.every_sweep`): ``./cirval up`` runs no Celery beat.
"""
