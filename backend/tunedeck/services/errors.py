"""Domain errors the routes map to HTTP answers (main.py): services raise them, never HTTPException."""


class NotFound(Exception):
    """No such row (404)."""


class Conflict(Exception):
    """The row is in a state that forbids the request (409)."""
