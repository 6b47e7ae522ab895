from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "audit"
    verbose_name = "Shortcut audits"

    def ready(self) -> None:
        # Register the Celery tasks in every process (web, commands, workers), so that
        # audit.runs.dispatch can send them by name without importing audit.tasks.
        from . import tasks  # noqa: F401
