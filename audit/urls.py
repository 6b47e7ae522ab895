from django.urls import path

from . import views
from .leaderboard import views as leaderboard_views

app_name = "audit"
urlpatterns = [
    path("audits/", views.audit_list, name="list"),
    path("audits/new/", views.audit_new, name="new"),
    path("audits/<int:pk>/", views.audit_detail, name="detail"),
    path("audits/<int:pk>/status/", views.audit_status, name="status"),
    path("leaderboards/", leaderboard_views.leaderboard_list, name="leaderboards"),
    path("leaderboards/<int:pk>/", leaderboard_views.leaderboard_detail, name="leaderboard"),
]
