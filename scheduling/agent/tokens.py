"""The two kinds of agent token, told apart by prefix (docs/agent-api.md, *Tokens*): an enrolment token
(``yen_``) may only register a new node; a node token (``ynd_``) speaks for exactly one node. Minted
here, stored hashed, checked in scheduling/agent/auth.py."""

from __future__ import annotations

import secrets

NODE_PREFIX = "ynd_"
ENROLMENT_PREFIX = "yen_"


def new_node_token() -> str:
    return NODE_PREFIX + secrets.token_urlsafe(30)


def new_enrolment_token() -> str:
    return ENROLMENT_PREFIX + secrets.token_urlsafe(30)
