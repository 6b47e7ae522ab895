"""Audit runs: planning, chunk execution with leases, recovery and aggregation.

Modules, in import order (each imports only those above it):

* :mod:`.base`: settings, errors, subset names, skip reasons;
* :mod:`.encoding`: the numeric core of a chunk (cached encoding, three-modality ranking; no Django);
* :mod:`.planning`: which queries, sessions and gallery; the chunks;
* :mod:`.leases`: the chunk claim and heartbeat (:mod:`retrieval.jobs.leases` for chunks);
* :mod:`.execution`: running one chunk (encode, rank, write rank rows);
* :mod:`.aggregation`: labels, figures, session filters and subsets of a finished run;
* :mod:`.dispatch`: sending chunks, coordinating, recovering stale work;
* :mod:`.panels`: per-query image panels and session ranks for the annotation app.

How a computed run goes (see also :mod:`audit.tasks`):

1. :func:`~audit.runs.planning.create_run` stores the run (status ``queued``); :func:`~audit.runs.dispatch.start_run` hands it to
   the coordinating task (or runs it in-process when asked to, :func:`~audit.runs.dispatch.run_inline`).
2. The coordinator *plans* it (:func:`~audit.runs.planning.plan_run`): which single-turn queries and which
   multi-turn sessions can be audited (the others are counted as skipped, with a
   reason), what the gallery is, and one chunk per (retriever, slice of the gallery),
   (retriever, slice of the queries) and (retriever, slice of the sessions), plus
   ``texts`` chunks for the tau encoder. Gallery chunks encode images into the
   embedding cache; query chunks encode the queries (one image and one text embedding
   each), rank the three modalities and write one :class:`AuditRank` row per (query,
   retriever); session chunks do the same for every turn of a session on its
   aggregated history (:func:`audit.runs.encoding.rank_sessions`) and write one
   :class:`AuditSessionRank` row per (session, retriever, strategy, modality); texts
   chunks store each session's largest text-text cosine (tau-diversity).
3. Chunks are Celery tasks. A task first *claims* its chunk (an atomic update that
   succeeds only for a pending chunk or one whose lease is stale); a done chunk
   returns at once, so a redelivered message is harmless, and rank rows are unique per
   (run, query, retriever) in the database. While it works, a heartbeat thread
   renews the lease.
4. When every chunk is done, :func:`~audit.runs.aggregation.aggregate_run` labels the queries with
   :func:`audit.labels.label_queries`, stores :class:`AuditLabel` rows, the report
   figures and the query subsets; :func:`~audit.runs.aggregation.aggregate_sessions` adds the session
   metrics, the CIRCLED filter table and the ``audit<id>:sessions_kept`` subset.

Sessions: turn ``l`` of a session is ranked with the history of turns ``1..l``
aggregated as latest, average or weighted (alpha = 0.8), for the multimodal
(composed), text-only and image-only embeddings; the positives are the session's
final targets; with ``exclude_reference`` turn ``l``'s own reference image is left out
of turn ``l``'s gallery. The filters (success, multi-turn, epsilon-consistency with
the run's ``epsilon``) are applied to the multimodal *latest* ranks of the run's first
retriever (:data:`SESSION_FILTER_BASIS`: the closest to CIRCLED's construction-time
single retriever, which ranks the newest query), tau-diversity to the text
embeddings of the run's ``tau_encoder`` (default: the first retriever).

Recovery (:func:`~audit.runs.dispatch.reconcile`): a running chunk whose heartbeat is
stale (its worker was killed; ``JOB_STALE_SECONDS``, see :mod:`retrieval.jobs.leases`) is
sent again; a chunk that was sent but never started is sent again at once after the
worker's broker connection came back (a broker restart), else once the whole run has
shown no activity for ``JOB_RESEND_SECONDS`` (the job framework's ``resend_lost``). Chunks
are finished and failed through the job framework too, with owner checks. Reconcile runs in every
worker's periodic sweep, in the coordinator's re-check, in ``run_audit --wait``, in
``manage.py resume_audits`` and when a worker starts (Celery's ``worker_ready`` signal),
which also takes over coordination.

Gallery: every query searches the gallery :mod:`retrieval.galleries` gives it (its
split's, or its category's for FashionIQ and Multi-turn FashionIQ, or every image of the
dataset when there is none); the run encodes the union of its queries' galleries and ranks
each query against its own. Images without a file (``missing`` at import, or unreadable
now) are left out.
"""
