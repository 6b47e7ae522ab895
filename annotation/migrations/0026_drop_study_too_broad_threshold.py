# Study.too_broad_threshold was never read: the threshold the item page states is the rubric's
# (annotation.core.rubric.Rubric.too_broad_threshold), defined once there.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("annotation", "0025_study_estimate"),
    ]

    operations = [
        migrations.RemoveField(
            model_name="study",
            name="too_broad_threshold",
        ),
    ]
