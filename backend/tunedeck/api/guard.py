"""The network guard in front of every request: Host, Origin, the write header, the bind rule, and
the security headers on every response.

Browsers attach no credentials here (bearer tokens, no cookies), but on the default set-up writes
need none: a page from anywhere could POST to a loopback server. A cross-site page cannot send a
custom header without a CORS preflight, which this server never grants, so every write must carry
`X-Tunedeck` (or a bearer token). A Host the server was not configured for is a DNS-rebinding page.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import stat
from ipaddress import ip_address
from urllib.parse import urlsplit

import psutil

from tunedeck.config import Settings

log = logging.getLogger("tunedeck.api.guard")
WRITE_HEADER = "x-tunedeck"
SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}
# Set in a request's scope when this process listens off loopback though TUNEDECK_HOST is a loopback
# address (plain uvicorn): auth then wants a token to read, as it does where TUNEDECK_HOST says so.
EXPOSED = "tunedeck.exposed"
# plotly injects its own <style> rules, and the pages use a few style attributes: styles stay inline-able.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
# FastAPI's /docs and /redoc load their bundles from a CDN with an inline bootstrap script.
DOCS_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net; "
    "style-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net https://fonts.googleapis.com; "
    "font-src 'self' https://fonts.gstatic.com; img-src 'self' data: https://fastapi.tiangolo.com "
    "https://cdn.redoc.ly; worker-src 'self' blob:; connect-src 'self'; object-src 'none'; "
    "base-uri 'none'; frame-ancestors 'none'"
)
DOCS = re.compile(r"^/(docs|redoc)(/|$)")


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    try:
        return host == "localhost" or ip_address(host).is_loopback
    except ValueError:
        return False


def reads_warning(settings: Settings, *, exposed: bool = False) -> str | None:
    """What the start says, loudly, when reads were opened explicitly off loopback (None otherwise);
    `exposed`: this process was found listening off loopback whatever TUNEDECK_HOST says."""
    off_loopback = exposed or not is_loopback(settings.host)
    if not (off_loopback and settings.open_read_given and settings.open_read):
        return None
    return (
        "TUNEDECK_OPEN_READ=true on a server listening off loopback: ANYONE WHO CAN REACH THIS PORT READS "
        "EVERY JOB'S CONFIG, LOGS AND DATASET ROWS AND DOWNLOADS EVERY ADAPTER AND CHECKPOINT. Unset it and "
        "give a wall screen a viewer token: `tunedeck token create --name wall --role viewer`."
    )


def _is_ip(host: str) -> bool:
    try:
        ip_address(host)
        return True
    except ValueError:
        return False


def split_host(value: str) -> tuple[str, int | None]:
    """`name:port`, `[::1]:port` or `name` as (lower-case host without brackets, port)."""
    try:
        parts = urlsplit(f"//{value}")
        return (parts.hostname or "").lower(), parts.port
    except ValueError:
        return "", None


def allowed_hosts(settings: Settings) -> set[str]:
    names = {*LOOPBACK_NAMES, *(h.lower() for h in settings.allowed_hosts)}
    if settings.host not in ("0.0.0.0", "::", ""):
        names.add(settings.host.strip("[]").lower())
    if settings.server_url:
        names.add(split_host(urlsplit(settings.server_url).netloc)[0])
    return names


def own_listeners() -> list[tuple[str, int]] | None:
    """(address, port) of every IP socket this process listens on, read from its own descriptors
    (None where /proc/self/fd is not there)."""
    try:
        fds = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        return None
    found = []
    for fd in fds:
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            dup = os.dup(fd)  # a socket object owns its descriptor: it closes the copy, not ours
        except OSError:  # closed meanwhile (or the listing's own descriptor)
            continue
        try:
            sock = socket.socket(fileno=dup)
        except OSError:
            os.close(dup)
            continue
        with sock:
            try:
                if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.getsockopt(
                    socket.SOL_SOCKET, socket.SO_ACCEPTCONN
                ):
                    found.append(sock.getsockname()[:2])
            except OSError:
                continue
    return found


def listening_exposed(port: int | None) -> bool | None:
    """Whether this process listens on `port` at a non-loopback address (None: cannot tell)."""
    # Its own descriptors, not the host's connection tables (psutil reads them all: ~10 ms here, more
    # on a busy host, on the first request's path).
    listeners = own_listeners()
    if listeners is not None:
        addrs = [a for a, p in listeners if p == port]
    else:
        try:
            addrs = [
                c.laddr.ip
                for c in psutil.Process().net_connections(kind="inet")
                if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
            ]
        except (psutil.Error, OSError):
            return None
    if not addrs:
        return None
    return any(not is_loopback(a) for a in addrs)


class Guard:
    """Pure ASGI middleware (streams pass through untouched)."""

    def __init__(self, app, settings: Settings):
        self.app = app
        self.settings = settings
        self.hosts = allowed_hosts(settings)
        self.any_host = "*" in settings.allowed_hosts
        self._exposed: bool | None = None  # a non-loopback bind, learnt at the first request
        self._warned = False  # reads opened explicitly, said once when found listening off loopback
        # Worth learning where it changes something: open writes (refused), or reads that are open
        # only because the configured host is a loopback one (closed, or a warning where set explicitly).
        self.watch = settings.open_write or (settings.open_read and is_loopback(settings.host))

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        csp = DOCS_CSP if DOCS.match(scope.get("path", "")) else CSP

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                headers = [
                    h
                    for h in message.get("headers", [])
                    if h[0].lower()
                    not in (b"content-security-policy", b"x-frame-options", b"x-content-type-options")
                ]
                headers += [
                    (b"content-security-policy", csp.encode()),
                    (b"x-content-type-options", b"nosniff"),
                    (b"x-frame-options", b"DENY"),
                    (b"referrer-policy", b"same-origin"),
                ]
                message = {**message, "headers": headers}
            await send(message)

        refusal = self.check(scope)
        if refusal is not None:
            status, detail = refusal
            body = json.dumps({"detail": detail}).encode()
            await send_with_headers(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send_with_headers({"type": "http.response.body", "body": body})
            return None
        return await self.app(scope, receive, send_with_headers)

    def check(self, scope) -> tuple[int, object] | None:
        """(status, detail) when the request must be refused, else None."""
        if self.watch and self._bind_exposed(scope):
            if self.settings.open_write:
                return 503, (
                    "refusing to serve: this server listens on a non-loopback address with "
                    "TUNEDECK_OPEN_WRITE=true, so anyone on the network could launch and kill jobs. Create "
                    "tokens (`tunedeck token create`) and set TUNEDECK_OPEN_WRITE=false."
                )
            scope[EXPOSED] = True
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host_value = headers.get("host")
        host = split_host(host_value)[0] if host_value is not None else ""
        if host_value is not None and not self.any_host and not (host in self.hosts or _is_ip(host)):
            return 400, [
                {
                    "loc": ["header", "Host"],
                    "type": "value_error",
                    "msg": f"this server does not answer to the name {host!r}: add it to "
                    "TUNEDECK_ALLOWED_HOSTS (a guard against DNS rebinding)",
                }
            ]
        origin = headers.get("origin")
        if origin is not None and not self._same_origin(origin, host_value):
            return 403, [
                {
                    "loc": ["header", "Origin"],
                    "type": "value_error",
                    "msg": f"cross-origin request from {origin[:200]!r} refused",
                }
            ]
        if (
            scope["method"] not in SAFE_METHODS
            and WRITE_HEADER not in headers
            and not headers.get("authorization", "").lower().startswith("bearer ")
        ):
            return 403, [
                {
                    "loc": ["header", "X-Tunedeck"],
                    "type": "missing",
                    "msg": "a request that changes something needs the header `X-Tunedeck: 1` "
                    "(or a bearer token): a cross-site form cannot send it",
                }
            ]
        return None

    @staticmethod
    def _same_origin(origin: str, host_value: str | None) -> bool:
        try:
            o = urlsplit(origin)
            o_port = o.port or {"http": 80, "https": 443}.get(o.scheme)
        except ValueError:
            return False
        if not o.hostname or host_value is None:
            return False
        host, port = split_host(host_value)
        return o.hostname.lower() == host and o_port == (port or {"http": 80, "https": 443}.get(o.scheme))

    def _bind_exposed(self, scope) -> bool:
        server = scope.get("server") or (None, None)
        if self._exposed is None:
            self._exposed = listening_exposed(server[1])
            if self._exposed and self.settings.open_write:
                log.error("TUNEDECK_OPEN_WRITE=true on a non-loopback address: refusing every request")
        if self._exposed is not None:
            exposed = self._exposed
        else:  # No listening socket seen (an in-process client): judge by the address this connection came to.
            addr = str(server[0] or "")
            exposed = _is_ip(addr.strip("[]")) and not is_loopback(addr)
        if exposed and not self._warned and (warning := reads_warning(self.settings, exposed=True)):
            self._warned = True  # once, like the start's own warning
            log.warning(warning)
        return exposed


QUERY_TOKEN = re.compile(r"(access(?:_|%5f)token=)[^&\s\"]*", re.IGNORECASE)


class RedactTokens(logging.Filter):
    """Access-log lines show `access_token=[redacted]`: a log is read by more people than tokens are."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                QUERY_TOKEN.sub(r"\1[redacted]", a) if isinstance(a, str) else a for a in record.args
            )
        if isinstance(record.msg, str):
            record.msg = QUERY_TOKEN.sub(r"\1[redacted]", record.msg)
        return True


def install(app, settings: Settings) -> None:
    """The guard outermost (before auth reads a body or a token), and the access-log redaction."""
    app.add_middleware(Guard, settings=settings)
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactTokens) for f in access.filters):
        access.addFilter(RedactTokens())
