# Rendezvous ports are unique per rank-0 address, not per rank-0 node: nodes that share an address
# share one port space (the rendezvous store binds every interface).

from django.db import migrations, models
from django.db.models import Count

LIVE = ["ASSIGNED", "RUNNING", "STOPPING"]


def refuse_shared_live_ports(apps, schema_editor):
    """Live gangs that already share an address and a port are cross-wired (each rank may have joined the
    other job's store): name them, rather than fail on the index with a bare duplicate-key error."""
    Task = apps.get_model("scheduling", "Task")
    shared = (
        Task.objects.filter(rank=0, master_port__isnull=False, state__in=LIVE)
        .values("master_addr", "master_port")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
    )
    clashes = []
    for row in shared:
        jobs = Task.objects.filter(
            rank=0, state__in=LIVE, master_addr=row["master_addr"], master_port=row["master_port"]
        ).values_list("job_id", flat=True)
        clashes.append(f"{row['master_addr']}:{row['master_port']} (jobs {', '.join(str(j) for j in sorted(jobs))})")
    if clashes:
        raise RuntimeError(
            "live gangs share a rendezvous address and port, so they may be cross-wired: "
            + "; ".join(clashes)
            + ". Cancel or requeue those jobs, then migrate again."
        )


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0012_job_one_per_node"),
    ]

    operations = [
        migrations.RunPython(refuse_shared_live_ports, migrations.RunPython.noop),
        migrations.RemoveConstraint(
            model_name="task",
            name="task_unique_live_rendezvous_port",
        ),
        migrations.AddConstraint(
            model_name="task",
            constraint=models.UniqueConstraint(
                condition=models.Q(("master_port__isnull", False), ("rank", 0), ("state__in", LIVE)),
                fields=("master_addr", "master_port"),
                name="task_unique_live_rendezvous_port",
            ),
        ),
    ]
