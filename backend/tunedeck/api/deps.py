"""Shared route dependencies."""

from __future__ import annotations

from typing import Annotated, TypedDict

from fastapi import Depends, Request, status

from tunedeck.checks.submission import Node
from tunedeck.config import Settings
from tunedeck.problems import SpecError
from tunedeck.schemas import JobCreated
from tunedeck.services.views.nodes import node_preflight


def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]


def get_node(request: Request) -> Node:
    """This node as a submission is checked against, from the cached inventory and preflight."""
    return node_of(request.app.state)


def node_of(state) -> Node:
    """`get_node` for the app's state (the server's own submissions: an automatic resume)."""
    cluster = state.executor.cluster()
    if cluster is not None:  # a cluster's nodes (Ray): this host's hardware says nothing of them
        nodes = tuple(cluster)
        return Node(
            gpus=max((n.gpus for n in nodes if n.alive), default=0),
            cluster=nodes,
            probe=state.executor.workspace_problems,
            check=state.executor.submit_problems,
        )
    return Node(
        gpus=state.node_gpus,
        preflight=node_preflight(state.settings),
        device_total_bytes=state.nodes.smallest_gpu_bytes() if state.node_gpus else None,
    )


NodeDep = Annotated[Node, Depends(get_node)]


def principal_name(request: Request) -> str | None:
    """Who is asking, by token name; None where the server is open."""
    principal = getattr(request.state, "principal", None)
    return principal.name if principal else None


class Creates(TypedDict):
    """The decorator arguments of a route that makes a job, typed for `**` into `router.post`."""

    status_code: int
    response_model: type[JobCreated]


# How every route that makes a job is declared: 201 and the new job.
CREATES: Creates = {"status_code": status.HTTP_201_CREATED, "response_model": JobCreated}


def job_created(request: Request, session, made: tuple) -> JobCreated:
    """A route's answer for the (job, check) it just made; the scheduler is woken to place it now."""
    job, checked = made
    scheduler = request.app.state.scheduler
    scheduler.wake()
    return JobCreated.made(job, checked.warnings, checked.notes, scheduler.queue(session))


def only_query(*names: str):
    """A dependency refusing query parameters other than `names` (422 at each), so a misspelt
    filter is an error rather than an unfiltered answer."""
    allowed = frozenset(names)

    def check(request: Request) -> None:
        unknown = [k for k in request.query_params if k not in allowed]
        if unknown:
            raise SpecError(
                [
                    {
                        "loc": ["query", k],
                        "msg": f"unknown query parameter; known: {', '.join(sorted(allowed))}",
                        "type": "extra_forbidden",
                    }
                    for k in unknown
                ]
            )

    return Depends(check)
