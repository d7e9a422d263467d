"""Inference services (docs/services.md): the writes (services.py), the reads (selectors.py), the
controller that keeps each service's replicas as wanted (controller.py: scaling, rollouts, rollbacks,
draining, autoscaling) and the Celery task that runs it (tasks.py).

A service's replicas are Jobs of kind "service", placed by the scheduler like any gang; this package
never places anything, it only makes and ends replica jobs.
"""
