from django.urls import path  # noqa: F401  (annotation pages are added here)

app_name = "annotation"
urlpatterns: list = []
