from django.contrib import admin

from .models import AuditChunk, AuditRun, AuditSessionRank


@admin.register(AuditRun)
class AuditRunAdmin(admin.ModelAdmin):
    list_display = ("id", "dataset", "split", "source", "k", "status", "done", "total", "created_at")
    list_filter = ("status", "source")
    readonly_fields = ("summary", "timings")


@admin.register(AuditChunk)
class AuditChunkAdmin(admin.ModelAdmin):
    list_display = ("id", "run", "retriever", "kind", "index", "status", "attempts", "owner", "heartbeat_at")
    list_filter = ("status", "kind")
    exclude = ("items",)


@admin.register(AuditSessionRank)
class AuditSessionRankAdmin(admin.ModelAdmin):
    list_display = ("id", "run", "query", "retriever", "strategy", "modality", "ranks")
    list_filter = ("strategy", "modality")
    raw_id_fields = ("run", "query")
