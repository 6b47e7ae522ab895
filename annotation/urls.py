from django.urls import path

from . import api, views

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
    # REST API
    path("api/studies/", api.studies, name="api_studies"),
    path("api/studies/<int:pk>/", api.study_detail, name="api_study"),
    path("api/studies/<int:pk>/next/", api.next_item, name="api_next"),
    path("api/studies/<int:pk>/progress/", api.study_progress, name="api_progress"),
    path("api/assignments/", api.assignments, name="api_assignments"),
    path("api/assignments/<int:pk>/", api.assignment_detail, name="api_assignment"),
    path("api/assignments/<int:pk>/draft/", api.draft, name="api_draft"),
    path("api/assignments/<int:pk>/skip/", api.skip, name="api_skip"),
    path("api/assignments/<int:pk>/judgements/", api.judgements, name="api_judgements"),
]
