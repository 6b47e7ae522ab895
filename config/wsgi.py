"""The WSGI application, warmed before it takes traffic.

Django imports the URLconf (and with it every view module and their libraries) and
compiles each template on the first request that needs them: about half a second of CPU
that would otherwise land on some annotator's first "next item" in every new web process.
:func:`warm_up` pays it at start-up instead (gunicorn starts a worker's process before
routing requests to it). Then the start-up heap is frozen out of the garbage collector's
scans (:func:`config.worker_tuning.freeze_startup_heap`), so a full collection in the
middle of a request costs milliseconds, not a fifth of a second.
"""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
application = get_wsgi_application()

#: Templates compiled at start-up: the pages annotators load most (the rest compile on first use).
WARM_TEMPLATES = (
    "base.html",
    "annotation/my_studies.html",
    "annotation/work_start.html",
    "annotation/item.html",
    "registration/login.html",
)


def warm_up() -> None:
    """Import every view (through the URLconf) and compile the annotators' templates."""
    from django.template import TemplateDoesNotExist
    from django.template.loader import get_template
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018 - imports the URLconf and every view module
    for name in WARM_TEMPLATES:
        try:
            get_template(name)
        except TemplateDoesNotExist:  # renamed: warming is best effort, serving is not affected
            pass


from django.conf import settings  # noqa: E402 - after the application is set up

if settings.WSGI_WARM_UP:
    warm_up()
    from config.worker_tuning import freeze_startup_heap

    freeze_startup_heap()  # what start-up loaded is never collected: keep it out of the collector's scans
