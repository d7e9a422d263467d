"""Celery tasks of the agent side (node liveness). Filled in by the agent API work."""
