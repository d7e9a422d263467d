"""Celery tasks of governance (idle reaper, accounting)."""
