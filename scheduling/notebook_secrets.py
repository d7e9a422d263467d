"""Notebook server tokens at rest: never in the clear in the database.

An agent reports its Jupyter server as ``http://node:port/notebooks/<id>/lab/?token=…`` (over its own
authenticated channel). The portal keeps that URL without the token and with the token sealed, in
``Task.notebook_url``::

    http://10.1.4.17:41873/notebooks/42/lab/#sealed-token=v1.<base64>

Sealed with AES-SIV (scheduling/sealed.py) under a key derived from SECRET_KEY: authenticated
(a changed value fails to open), and deterministic, so the same token reported in every heartbeat
seals to the same text and the heartbeat writes nothing when nothing changed. Only the notebook proxy
(portal/notebook_proxy.py) opens it, to add the token to the requests it forwards; the browser never
sees it. A key in SECRET_KEY_FALLBACKS still opens what was sealed before a rotation.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from scheduling.sealed import open_sealed, seal

MARK = "#sealed-token=v1."
_PURPOSE = b"yardmaster notebook token v1"


def _seal(token: str) -> str:
    return seal(token, purpose=_PURPOSE)


def _open(text: str) -> str | None:
    return open_sealed(text, purpose=_PURPOSE)


def seal_url(url: str | None) -> str | None:
    """The agent's URL as the portal keeps it: the token out of the query, sealed in the fragment."""
    if not url:
        return url
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    token = next((v for k, v in query if k == "token"), None)
    rest = urlencode([(k, v) for k, v in query if k != "token"])
    bare = urlunsplit((parts.scheme, parts.netloc, parts.path, rest, ""))
    return bare + MARK + _seal(token) if token else bare


@dataclass(frozen=True)
class Server:
    """A notebook's Jupyter server as the proxy reaches it."""

    base: str  # http://host:port/notebooks/42/lab/ (no token)
    token: str | None  # None: none was reported, or it cannot be opened (SECRET_KEY changed)


def open_url(stored: str) -> Server:
    base, mark, sealed = stored.partition(MARK)
    if not mark:
        # Written before tokens were sealed (or by a test): the token, if any, is still in the query.
        parts = urlsplit(stored)
        query = parse_qsl(parts.query, keep_blank_values=True)
        token = next((v for k, v in query if k == "token"), None)
        rest = urlencode([(k, v) for k, v in query if k != "token"])
        return Server(base=urlunsplit((parts.scheme, parts.netloc, parts.path, rest, "")), token=token)
    return Server(base=base, token=_open(sealed))
