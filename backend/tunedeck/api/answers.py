"""Which error statuses a route answers, as the OpenAPI schema declares them: `responses=errors(...)`.

The shapes of the answers (the error body `Message` included) are in schemas.py.
"""

from __future__ import annotations

from typing import Any

from tunedeck.schemas import Message

# A route's `responses=`: OpenAPI entries by status code.
Responses = dict[int | str, dict[str, Any]]

WHY = {
    401: "no token, or an invalid or revoked one",
    403: "the token's role (or ownership) does not allow this",
    404: "no such job (or preset, or node)",
    409: "the job has already ended",
    413: "the request body is larger than TUNEDECK_MAX_BODY_BYTES",
    503: "storage unavailable (read-only workspace or database)",
    507: "storage full",
}


# The body limit answers before any route runs, in plain text.
TOO_LARGE = {"description": WHY[413], "content": {"text/plain": {"schema": {"type": "string"}}}}


def errors(*codes: int) -> Responses:
    """`responses=` entries for these statuses, each answered as {"detail": "..."} (413: plain text)."""
    return {
        code: TOO_LARGE if code == 413 else {"model": Message, "description": WHY[code]} for code in codes
    }


# Every /api route: the token guard and the storage errors any database access can meet.
COMMON = errors(401, 403, 503, 507)
