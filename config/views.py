from django.contrib.auth.decorators import login_not_required
from django.db import connection
from django.http import JsonResponse
from django.shortcuts import render

from retrieval.models import Dataset


def home(request):
    return render(request, "home.html", {"datasets": Dataset.objects.all()[:20]})


@login_not_required
def healthz(request):
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"ok": True})
