from django.contrib.auth import views as auth_views
from django.urls import path, reverse_lazy

from annotation.room import views

app_name = "room"
urlpatterns = [
    path("room/users/", views.users, name="users"),
    path("room/users/<int:user_id>/", views.user_update, name="user_update"),
    path(
        "room/invite/<uidb64>/<token>/",
        auth_views.PasswordResetConfirmView.as_view(
            template_name="room/invite.html", success_url=reverse_lazy("login"), post_reset_login=False
        ),
        name="invite",
    ),
    path("room/studies/<int:study_id>/", views.study_room, name="study"),
    path("room/studies/<int:study_id>/settings/", views.study_settings, name="study_settings"),
    path("room/studies/<int:study_id>/annotators/", views.study_annotators, name="study_annotators"),
    path("room/studies/<int:study_id>/status/", views.study_status, name="study_status"),
    path("room/studies/<int:study_id>/gold/", views.study_gold, name="study_gold"),
    path("room/jobs/", views.jobs, name="jobs"),
    path("room/imports/", views.imports, name="imports"),
    path("room/imports/<int:pk>/", views.import_job, name="import_job"),
    path("room/imports/<int:pk>/status/", views.import_job_status, name="import_job_status"),
    path("room/jobs.json", views.jobs_json, name="jobs_json"),
    path("room/audits/<int:run_id>/retry/", views.audit_retry, name="audit_retry"),
]
