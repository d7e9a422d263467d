"""Celery tasks of the scheduler (the cycle). Filled in by the scheduling service work."""
