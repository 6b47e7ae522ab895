from django.urls import path  # noqa: F401  (audit pages are added here)

app_name = "audit"
urlpatterns: list = []
