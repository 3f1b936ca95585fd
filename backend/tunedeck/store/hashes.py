"""Tokens are stored as their SHA-256 only (API tokens and each job's runner tokens alike): the one
hasher, so a token is checked the way it was kept. A Ray node that makes its runner's token tells
the server only this hash of it."""

from __future__ import annotations

import hashlib


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
