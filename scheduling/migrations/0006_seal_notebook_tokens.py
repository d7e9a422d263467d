"""Seal the notebook tokens stored in the clear before scheduling/notebook_secrets.py existed."""

from django.db import migrations


def seal(apps, schema_editor):
    from scheduling.notebook_secrets import MARK, seal_url

    Task = apps.get_model("scheduling", "Task")
    for task in Task.objects.filter(notebook_url__contains="token=").exclude(notebook_url__contains=MARK).iterator():
        Task.objects.filter(pk=task.pk).update(notebook_url=seal_url(task.notebook_url) or "")


class Migration(migrations.Migration):
    dependencies = [("scheduling", "0005_enrolment_token_uses")]
    operations = [migrations.RunPython(seal, migrations.RunPython.noop)]
