from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("retrieval", "0001_initial")]

    operations = [
        migrations.AddField(
            model_name="query",
            name="content_hash",
            field=models.CharField(
                blank=True,
                max_length=64,
                help_text="Digest of the normalised record, turns and targets; a re-import rewrites the query only when it changes.",
            ),
        ),
    ]
