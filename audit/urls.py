from django.urls import path

from . import views

app_name = "audit"
urlpatterns = [
    path("audits/", views.audit_list, name="list"),
    path("audits/new/", views.audit_new, name="new"),
    path("audits/<int:pk>/", views.audit_detail, name="detail"),
    path("audits/<int:pk>/status/", views.audit_status, name="status"),
]
