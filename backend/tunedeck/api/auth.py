"""Bearer tokens with roles, and the request guard that enforces them.

viewer reads; submitter also launches and cancels its own jobs; admin does anything. Tokens are
shown once and stored as SHA-256 hashes. Runners use their own per-job tokens, checked by the
telemetry route, which can write only that job's telemetry.
"""

from __future__ import annotations

import enum
import hmac
import itertools
import os
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine
from sqlmodel import Session, col, select
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse

from tunedeck.api.guard import EXPOSED, is_loopback
from tunedeck.config import Settings
from tunedeck.store.hashes import token_hash
from tunedeck.store.tables import ApiToken, utcnow

PREFIX = "tdk_"
# Routes that carry their own credentials or must answer anyone.
EXEMPT = re.compile(r"^/api/(health$|jobs/\d+/telemetry(/stacks)?$)")
# POSTs that change nothing: a viewer may ask them (their cost is bounded by TUNEDECK_SPEC_MAX_KEYS).
READ_POSTS = re.compile(r"^/api/(lint|estimate|ui/parse-yaml|ui/preview)$")
# The OpenAI-compatible chat proxy: its clients always send an API key, tunedeck token or not.
OPENAI = re.compile(r"^/api/jobs/\d+/v1/")
# The only route that takes `?access_token=` (the access log redacts it: tunedeck.api.guard).
STREAM = "/api/stream"
# Who is asking answers anyone (a page must learn that it has to sign in); a token sent is still checked.
WHO = "/api/me"
# A name no token can have (create_token refuses it): "a job another token made", for `acts_on`.
SOMEONE_ELSE = ""


class Role(str, enum.Enum):
    viewer = "viewer"
    submitter = "submitter"
    admin = "admin"

    @property
    def rank(self) -> int:
        """Each role may do what the ones declared before it may."""
        return list(Role).index(self)


@dataclass(frozen=True)
class Principal:
    name: str
    role: Role


class AuthError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def create_token(session: Session, *, name: str, role: Role) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}", name):
        raise ValueError("name: letters, digits and . _ @ - only, at most 64 characters")
    if session.exec(
        select(ApiToken).where(ApiToken.name == name, col(ApiToken.revoked_at).is_(None))
    ).first():
        raise ValueError(f"name: an active token named {name!r} exists; revoke it first")
    token = PREFIX + secrets.token_urlsafe(32)
    session.add(ApiToken(name=name, role=role.value, token_hash=token_hash(token)))
    session.commit()
    return token


def list_tokens(session: Session) -> list[ApiToken]:
    return list(session.exec(select(ApiToken).order_by(col(ApiToken.id))))


def revoke_token(session: Session, *, name: str) -> int:
    tokens = list(
        session.exec(select(ApiToken).where(ApiToken.name == name, col(ApiToken.revoked_at).is_(None)))
    )
    for t in tokens:
        t.revoked_at = utcnow()
        session.add(t)
    session.commit()
    return len(tokens)


def ensure_admin(engine: Engine, path: Path) -> str | None:
    """With no active admin token, register the one in `path` (written there first when missing).

    Returns what was done, for the log; None when an admin token was already active."""
    with Session(engine) as session:
        active = select(ApiToken).where(ApiToken.role == Role.admin.value, col(ApiToken.revoked_at).is_(None))
        if session.exec(active).first():
            return None
        if path.exists():
            token = path.read_text().strip()
            if len(token) < 20:
                raise RuntimeError(
                    f"admin token file {path}: holds {len(token)} characters, a token needs 20 or more"
                )
            if session.exec(select(ApiToken).where(ApiToken.token_hash == token_hash(token))).first():
                return f"the token in {path} was revoked or is not an admin's: not registered again"
            what = f"registered the admin token from {path}"
        else:
            token = PREFIX + secrets.token_urlsafe(32)
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(token + "\n")
            what = f"created an admin token in {path} (read it there; only its hash is in the database)"
        taken = {t.name for t in session.exec(select(ApiToken).where(col(ApiToken.revoked_at).is_(None)))}
        name = next(
            n
            for n in itertools.chain(["admin"], (f"admin-{i}" for i in itertools.count(2)))
            if n not in taken
        )
        session.add(ApiToken(name=name, role=Role.admin.value, token_hash=token_hash(token)))
        session.commit()
        return f"{what}, named {name!r}"


def authenticate(engine: Engine, token: str) -> Principal | None:
    digest = token_hash(token)
    with Session(engine) as session:
        # Whatever row the query gave is compared again below, so a query that matched too much could
        # only refuse; SQLite walks the unique index on token_hash, so even a `>=` finds the match first.
        row = session.exec(
            select(ApiToken).where(
                ApiToken.token_hash == digest,  # pragma: no mutate
                col(ApiToken.revoked_at).is_(None),
            )
        ).first()
        if row is None or not hmac.compare_digest(row.token_hash, digest):
            return None
        return Principal(name=row.name, role=Role(row.role))


def writes_are_safe(settings: Settings) -> str | None:
    """Why the server must not start: open writes on a non-loopback address (None when fine)."""
    if not settings.open_write or is_loopback(settings.host):
        return None
    return (
        f"refusing to bind {settings.host} with TUNEDECK_OPEN_WRITE=true: anyone on the network could "
        "launch and kill jobs. Create tokens (`tunedeck token create`) and set TUNEDECK_OPEN_WRITE=false."
    )


def reads_open(settings: Settings, *, exposed: bool = False) -> bool:
    """Whether reading needs no token. TUNEDECK_OPEN_READ decides where it was given; left unset, reads
    are open on a loopback address only (`exposed`: the guard found this process listening off loopback
    whatever TUNEDECK_HOST says). A team server's port otherwise hands out every adapter, checkpoint,
    config, log and dataset row to anyone who can reach it."""
    if settings.open_read_given:
        return settings.open_read
    return settings.open_read and not exposed and is_loopback(settings.host)


def _token_of(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if header:
        scheme, _, value = header.partition(" ")
        return value.strip() if scheme.lower() == "bearer" else None
    if request.method == "GET" and request.url.path == STREAM:  # EventSource cannot set headers
        return request.query_params.get("access_token")
    return None


async def principal_for(request: Request, settings: Settings, engine: Engine) -> Principal | None:
    """Who is asking, or AuthError when this request needs more than they have."""
    path = request.url.path
    token = _token_of(request)
    if token and settings.open_write and OPENAI.match(path) and not token.startswith(PREFIX):
        # The stock OpenAI client needs some key: on an open (loopback) server one that is no tunedeck
        # token names nobody, as no key would, instead of failing as an invalid token.
        token = None
    principal = None
    if token and not EXEMPT.match(path):
        principal = await run_in_threadpool(authenticate, engine, token)
        if principal is None:
            raise AuthError(401, "invalid or revoked token")
    if not (path.startswith("/api/") or path == "/metrics") or EXEMPT.match(path):
        return principal
    reading = request.method in ("GET", "HEAD", "OPTIONS") or bool(READ_POSTS.match(path))
    if reading:
        if (
            principal is None
            and path != WHO
            and not reads_open(settings, exposed=bool(request.scope.get(EXPOSED)))
        ):
            why = "TUNEDECK_OPEN_READ=false" if settings.open_read_given else "off loopback"
            raise AuthError(401, f"a token is required to read ({why})")
    elif not settings.open_write:
        if principal is None:
            raise AuthError(401, "a submitter or admin token is required")
        if principal.role.rank < Role.submitter.rank:
            raise AuthError(403, f"role {principal.role.value} cannot change anything")
    return principal


class Auth:
    """Puts the request's principal in its state, or answers 401/403 itself. Plain ASGI: it reads only
    the head of the request, so the body streams through untouched (no task and no copy per request,
    as an `@app.middleware("http")` would add to every telemetry batch)."""

    def __init__(self, app, settings: Settings):
        self.app, self.settings = app, settings

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request = Request(scope)
        try:
            request.state.principal = await principal_for(request, self.settings, scope["app"].state.engine)
        except AuthError as e:
            response = JSONResponse(
                status_code=e.status,
                content={"detail": str(e)},
                headers={"WWW-Authenticate": "Bearer"} if e.status == 401 else None,
            )
            return await response(scope, receive, send)
        await self.app(scope, receive, send)


def install(app, settings: Settings) -> None:
    app.add_middleware(Auth, settings=settings)


def may_act(principal: Principal | None, owners: Iterable[str | None], settings: Settings) -> bool:
    """Whether `principal` may act on a job that any of `owners` owns (cancel it, chat with it): where
    writes are open, anyone without a token, and anyone at all on a job nobody owns (an OpenAI client
    always sends its key: a token); else an owner who may submit, or an admin."""
    owners = set(owners)
    if settings.open_write and (principal is None or owners <= {None}):
        return True
    if principal is None:
        return False
    return principal.role == Role.admin or (principal.role == Role.submitter and principal.name in owners)


def may_cancel(principal: Principal | None, owner: str | None, settings: Settings) -> bool:
    return may_act(principal, (owner,), settings)


def acts_on(principal: Principal | None, settings: Settings) -> dict[str, bool]:
    """Which jobs `principal` may act on, by whose they are: `may_act` itself asked of each kind, so a
    page offers exactly what the server would allow."""
    return {
        "own": principal is not None and may_act(principal, (principal.name,), settings),
        "unowned": may_act(principal, (None,), settings),
        "others": may_act(principal, (SOMEONE_ELSE,), settings),
    }


def may_read(principal: Principal | None, settings: Settings, *, exposed: bool) -> bool:
    """Whether `principal` may read jobs: the guard's rule for reads (`principal_for`)."""
    return principal is not None or reads_open(settings, exposed=exposed)


def may_submit(principal: Principal | None, settings: Settings) -> bool:
    """Whether `principal` may launch jobs: the guard's rule for writes (`principal_for`)."""
    return settings.open_write or (principal is not None and principal.role.rank >= Role.submitter.rank)
