from django.contrib import admin

from annotation.models import Adjudication, Assignment, Draft, ExportJob, Judgement, RubricVersion, Study, StudyItem


@admin.register(RubricVersion)
class RubricVersionAdmin(admin.ModelAdmin):
    list_display = ("key", "version", "title", "created_at")


@admin.register(Study)
class StudyAdmin(admin.ModelAdmin):
    list_display = ("name", "rubric", "overlap", "blind", "status", "created_at")
    list_filter = ("status", "rubric")
    filter_horizontal = ("annotators",)
    readonly_fields = ("pool",)


@admin.register(StudyItem)
class StudyItemAdmin(admin.ModelAdmin):
    list_display = ("study", "query", "hidden_category", "agreement", "taken", "completed")
    list_filter = ("study", "hidden_category", "agreement")
    raw_id_fields = ("query",)


@admin.register(Assignment)
class AssignmentAdmin(admin.ModelAdmin):
    list_display = ("study", "item", "annotator", "status", "served_by", "position", "lease_expires")
    list_filter = ("study", "status", "served_by")
    raw_id_fields = ("item",)


@admin.register(Judgement)
class JudgementAdmin(admin.ModelAdmin):
    list_display = ("assignment", "revision", "is_current", "category", "sub_reason", "flagged", "created_at")
    list_filter = ("is_current", "category", "flagged")
    raw_id_fields = ("assignment",)


@admin.register(Adjudication)
class AdjudicationAdmin(admin.ModelAdmin):
    list_display = ("study", "item", "decision", "is_current", "decided_by", "decided_at")
    list_filter = ("study", "is_current")
    raw_id_fields = ("item",)


@admin.register(ExportJob)
class ExportJobAdmin(admin.ModelAdmin):
    list_display = ("id", "study", "policy", "status", "done", "total", "created_at")
    readonly_fields = ("manifest", "error")


admin.site.register(Draft)
