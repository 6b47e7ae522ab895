from django.contrib import admin

from .models import Dataset, GalleryEntry, Image, ImportJob, Query, QuerySubset, Target, Turn


@admin.register(Dataset)
class DatasetAdmin(admin.ModelAdmin):
    list_display = ("name", "format", "images_root", "created_at")
    search_fields = ("name",)


@admin.register(Image)
class ImageAdmin(admin.ModelAdmin):
    list_display = ("external_id", "dataset", "path", "width", "height", "missing")
    list_filter = ("dataset", "missing")
    search_fields = ("external_id", "path", "sha256")
    list_select_related = ("dataset",)


class TurnInline(admin.TabularInline):
    model = Turn
    extra = 0
    raw_id_fields = ("reference_image", "turn_target")


class TargetInline(admin.TabularInline):
    model = Target
    extra = 0
    raw_id_fields = ("image",)


@admin.register(Query)
class QueryAdmin(admin.ModelAdmin):
    list_display = ("external_id", "dataset", "split", "category", "n_turns")
    list_filter = ("dataset", "split", "n_turns")
    search_fields = ("external_id",)
    inlines = [TurnInline, TargetInline]
    list_select_related = ("dataset",)


@admin.register(QuerySubset)
class QuerySubsetAdmin(admin.ModelAdmin):
    list_display = ("name", "dataset", "source", "created_at")
    filter_horizontal = ()
    raw_id_fields = ("queries",)


@admin.register(ImportJob)
class ImportJobAdmin(admin.ModelAdmin):
    list_display = ("id", "dataset_name", "format", "status", "done", "total", "created_at")
    readonly_fields = ("report", "error")


admin.site.register(GalleryEntry)
admin.site.site_header = "CIRVal administration"
