from django.apps import AppConfig


class AnnotationConfig(AppConfig):
    name = "annotation"
    verbose_name = "Human validation"

    def ready(self) -> None:
        from django.contrib.auth import get_user_model
        from django.db.models.signals import m2m_changed, post_delete, post_save, pre_delete

        from annotation import sizes
        from annotation.access import may_fetch_image
        from annotation.models import Study, StudyItem
        from retrieval.access import set_image_access

        set_image_access(may_fetch_image)  # annotators fetch only the images they were shown

        # the study's sizes (Study.n_*) follow its items and annotators (annotation/sizes.py)
        m2m_changed.connect(
            sizes.annotators_changed,
            sender=Study.annotators.through,
            weak=False,
            dispatch_uid="cirval-study-annotators",
        )
        # an annotator removed from a study gives back the items they hold (annotation/assignment/membership.py)
        from annotation.assignment.membership import members_removed

        m2m_changed.connect(
            members_removed, sender=Study.annotators.through, weak=False, dispatch_uid="cirval-study-members-removed"
        )
        post_save.connect(sizes.item_saved, sender=StudyItem, weak=False, dispatch_uid="cirval-item-saved")
        post_delete.connect(sizes.item_deleted, sender=StudyItem, weak=False, dispatch_uid="cirval-item-deleted")
        pre_delete.connect(
            sizes.user_deleting, sender=get_user_model(), weak=False, dispatch_uid="cirval-user-deleting"
        )
        post_delete.connect(sizes.user_deleted, sender=get_user_model(), weak=False, dispatch_uid="cirval-user-deleted")

        from annotation.judging.candidates import panels_after_audit
        from audit.runs.aggregation import audit_finished

        audit_finished.connect(panels_after_audit, weak=False, dispatch_uid="cirval-panels-after-audit")

        # a counted judgement of an estimate study re-plans its sample (serving sits below studies)
        from annotation.assignment.queue import estimate_judged

        estimate_judged.connect(replan_estimate, weak=False, dispatch_uid="cirval-estimate-judged")

        import annotation.tasks  # noqa: F401  registers the tasks the web tier sends by name (fill_candidates)


def replan_estimate(sender, study_id: int, **kwargs) -> None:
    """Receiver of ``annotation.assignment.queue.estimate_judged``."""
    from annotation.studies.estimating import after_submit

    after_submit(study_id)
