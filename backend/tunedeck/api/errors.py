"""How errors become answers: domain errors and bad input map to 4xx/5xx with a clear `detail`."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DatabaseError

from tunedeck.config import Settings
from tunedeck.problems import SpecError
from tunedeck.services.errors import Conflict, Forbidden, NotFound
from tunedeck.services.ingest.storage import RETRY_AFTER_S, StorageFault, fault_of


def _storage(request: Request, fault: StorageFault) -> JSONResponse:
    """507 (full) or 503 with the reason and Retry-After; /api/health says it too while it holds."""
    health = getattr(request.app.state, "storage", None)
    if health is not None:
        health.failed(fault)
    return JSONResponse(
        status_code=fault.status,
        headers={"Retry-After": str(RETRY_AFTER_S)},
        content={"detail": fault.reason},
    )


def install(app: FastAPI, settings: Settings) -> None:
    @app.exception_handler(RecursionError)
    async def _too_deep(_: Request, e: RecursionError) -> JSONResponse:
        return JSONResponse(
            status_code=422,
            content={"detail": [{"loc": ["body"], "msg": "nested too deeply", "type": "value_error"}]},
        )

    @app.exception_handler(OverflowError)
    async def _overflow(_: Request, e: OverflowError) -> JSONResponse:
        # An id or cursor beyond SQLite's 64-bit integers cannot name anything.
        return JSONResponse(
            status_code=422,
            content={
                "detail": [
                    {"loc": ["request"], "msg": f"id or cursor out of range: {e}", "type": "value_error"}
                ]
            },
        )

    @app.exception_handler(DatabaseError)
    async def _db_error(request: Request, e: DatabaseError) -> JSONResponse:
        text = str(e.orig)
        if "locked" in text or "busy" in text:
            # Another writer (a backup, a sqlite3 shell) held the lock past TUNEDECK_DB_BUSY_TIMEOUT_S.
            return JSONResponse(
                status_code=503,
                headers={"Retry-After": "5"},
                content={
                    "detail": f"database busy, retry: another writer held it for more than "
                    f"{settings.db_busy_timeout_s:g} s"
                },
            )
        if fault := fault_of(e):  # a full disk, a read-only workspace, a damaged file
            return _storage(request, fault)
        raise e

    @app.exception_handler(OSError)
    async def _os_error(request: Request, e: OSError) -> JSONResponse:
        # Disk full or a read-only workspace: say so instead of a bare 500.
        if fault := fault_of(e):
            return _storage(request, fault)
        return JSONResponse(status_code=503, content={"detail": f"storage error: {e.strerror or e}"})

    @app.exception_handler(StorageFault)
    async def _storage_fault(request: Request, e: StorageFault) -> JSONResponse:
        return _storage(request, e)  # what the ingest writer's store met

    @app.exception_handler(SpecError)
    async def _spec_error(_: Request, e: SpecError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": e.errors})

    @app.exception_handler(NotFound)
    async def _not_found(_: Request, e: NotFound) -> JSONResponse:
        return JSONResponse(status_code=404, content={"detail": str(e)})

    @app.exception_handler(Conflict)
    async def _conflict(_: Request, e: Conflict) -> JSONResponse:
        return JSONResponse(status_code=409, content={"detail": str(e)})

    @app.exception_handler(Forbidden)
    async def _forbidden(_: Request, e: Forbidden) -> JSONResponse:
        return JSONResponse(status_code=403, content={"detail": str(e)})

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        # Field and reason only: echoing the input back could be large.
        errors = [
            {"loc": list(err.get("loc", ())), "msg": err.get("msg"), "type": err.get("type")}
            for err in e.errors()
        ]
        return JSONResponse(status_code=422, content={"detail": errors})
