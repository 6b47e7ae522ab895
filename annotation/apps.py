from django.apps import AppConfig


class AnnotationConfig(AppConfig):
    name = "annotation"
    verbose_name = "Human validation"

    def ready(self) -> None:
        from django.db.models.signals import m2m_changed

        from retrieval.access import set_image_access

        from annotation.access import may_fetch_image
        from annotation.verdicts.state import forget_study_sizes
        from annotation.models import Study

        set_image_access(may_fetch_image)  # annotators fetch only the images they were shown

        def annotators_changed(sender, instance, action, **kwargs):
            if action.startswith("post_") and isinstance(instance, Study):
                forget_study_sizes(instance)

        m2m_changed.connect(annotators_changed, sender=Study.annotators.through, weak=False,
                            dispatch_uid="cirval-study-annotators")

        from audit.runs.aggregation import audit_finished

        from annotation.judging.candidates import panels_after_audit

        audit_finished.connect(panels_after_audit, weak=False, dispatch_uid="cirval-panels-after-audit")

        import annotation.tasks  # noqa: F401  registers the tasks the web tier sends by name (fill_candidates)
