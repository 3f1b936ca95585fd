"""Domain errors the routes map to HTTP answers (main.py): services raise them, never HTTPException."""


class NotFound(Exception):
    """No such row (404)."""


class Conflict(Exception):
    """The row is in a state that forbids the request (409)."""


class Forbidden(Exception):
    """The caller's token does not own the row and is no admin's (403)."""
