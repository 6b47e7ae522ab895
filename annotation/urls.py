from django.urls import path

from annotation import api, views
from annotation import report_pages as report_views
from annotation.interactive import api as interactive_api
from annotation.interactive import views as interactive_views
from annotation.release import views as release_views

app_name = "annotation"
urlpatterns = [
    path("annotate/", views.my_studies, name="my_studies"),
    path("annotate/<int:study_id>/", views.work, name="work"),
    path("annotate/<int:study_id>/item/<int:assignment_id>/", views.item, name="item"),
    path("annotate/<int:study_id>/history/", views.history, name="history"),
    path("annotate/<int:study_id>/upcoming/", views.upcoming, name="upcoming"),
    path("studies/", views.study_list, name="study_list"),
    path("studies/new/", views.study_new, name="study_new"),
    path("studies/<int:study_id>/progress/", views.study_progress_page, name="study_progress"),
    path("studies/<int:study_id>/suspicion/", views.study_suspicion_page, name="study_suspicion"),
    path("studies/<int:study_id>/estimate/", views.study_estimate_page, name="study_estimate"),
    # reports, adjudication, exports
    path("reports/", report_views.report_list, name="report_list"),
    path("studies/<int:study_id>/report/", report_views.report_page, name="report"),
    path("studies/<int:study_id>/report.json", report_views.report_json, name="report_json"),
    path("studies/<int:study_id>/report.csv", report_views.report_csv, name="report_csv"),
    path("studies/<int:study_id>/adjudication/", report_views.adjudication_queue_page, name="adjudication"),
    path(
        "studies/<int:study_id>/adjudication/<int:item_id>/",
        report_views.adjudication_item_page,
        name="adjudication_item",
    ),
    path("studies/<int:study_id>/exports/", report_views.export_list, name="export_list"),
    path("studies/<int:study_id>/export/", report_views.export_start, name="export_start"),
    path("exports/<int:pk>/", report_views.export_job_page, name="export_job"),
    path("exports/<int:pk>/status/", report_views.export_job_status, name="export_job_status"),
    path("exports/<int:pk>/files/<path:name>", report_views.export_file, name="export_file"),
    path("studies/<int:study_id>/release/", release_views.release_start, name="release_start"),
    path("releases/<int:pk>/", release_views.release_job_page, name="release_job"),
    path("releases/<int:pk>/status/", release_views.release_job_status, name="release_job_status"),
    path("releases/<int:pk>/zip", release_views.release_zip, name="release_zip"),
    path("releases/<int:pk>/files/<path:name>", release_views.release_file, name="release_file"),
    # REST API
    path("api/studies/", api.studies, name="api_studies"),
    path("api/studies/<int:pk>/", api.study_detail, name="api_study"),
    path("api/studies/<int:pk>/next/", api.next_item, name="api_next"),
    path("api/studies/<int:pk>/progress/", api.study_progress, name="api_progress"),
    path("api/assignments/", api.assignments, name="api_assignments"),
    path("api/assignments/<int:pk>/", api.assignment_detail, name="api_assignment"),
    path("api/assignments/<int:pk>/draft/", api.draft, name="api_draft"),
    path("api/assignments/<int:pk>/skip/", api.skip, name="api_skip"),
    path("api/assignments/<int:pk>/lease/", api.lease, name="api_lease"),
    path("api/assignments/<int:pk>/judgements/", api.judgements, name="api_judgements"),
    path("api/assignments/<int:pk>/interactive/", interactive_api.state, name="api_interactive"),
    path("api/assignments/<int:pk>/interactive/rounds/", interactive_api.rounds, name="api_interactive_rounds"),
    path("api/assignments/<int:pk>/interactive/retry/", interactive_api.retry, name="api_interactive_retry"),
    path("studies/<int:study_id>/interactive/export/", interactive_views.export_sessions, name="interactive_export"),
]
