from django.urls import path

from . import views

app_name = "retrieval"
urlpatterns = [
    path("datasets/", views.dataset_list, name="dataset_list"),
    path("datasets/import/", views.import_upload, name="import"),
    path("datasets/imports/<int:pk>/", views.import_job, name="import_job"),
    path("datasets/imports/<int:pk>/status/", views.import_job_status, name="import_job_status"),
    path("datasets/<slug:name>/", views.dataset_detail, name="dataset_detail"),
    path("datasets/<slug:name>/queries/<int:pk>/", views.query_detail, name="query_detail"),
    path("images/<int:pk>/", views.image, name="image"),
]
