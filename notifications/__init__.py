"""Notifications: job and quota events by e-mail, webhook and in the portal, derived from recorded rows."""
