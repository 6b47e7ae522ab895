from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_not_required
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView

from .security import LoginForm

urlpatterns = [
    # browsers ask for /favicon.ico on their own: the site's icon, not a 404 in every console
    path("favicon.ico", login_not_required(RedirectView.as_view(url=static("cirval/favicon.svg"), permanent=True))),
    path("", include("retrieval.site")),  # the home page and /healthz
    path(
        "login/",
        auth_views.LoginView.as_view(redirect_authenticated_user=True, authentication_form=LoginForm),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("", include("retrieval.urls")),
    path("", include("audit.urls")),
    path("", include("annotation.urls")),
    path("", include("annotation.room.urls")),
]

handler404 = "config.errors.page_not_found"
handler403 = "config.errors.permission_denied"
