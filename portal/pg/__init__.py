"""Django's PostgreSQL backend with a deadline on every round trip (portal/pg/base.py)."""
