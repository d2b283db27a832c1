"""Schemas of the attribution-job routes (README, "Attribution jobs")."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

Status = Literal["queued", "running", "succeeded", "failed", "cancelled"]


class Progress(BaseModel):
    done: int = Field(description="examples finished")
    total: int = Field(description="examples in the job")


class JobInfo(BaseModel):
    id: str
    model_id: str
    operation: str = Field(
        description='the route the job answers as, e.g. "attributions" or '
        '"context-attributions": its result is that route\'s response body'
    )
    method: str = Field(
        description="what runs: the method (a layer method on token models), or the "
        "operation's work where it has no method"
    )
    status: Status
    progress: Progress
    created_at: str = Field(description="ISO 8601, UTC")
    started_at: str | None = None
    finished_at: str | None = None
    error: dict[str, Any] | None = Field(
        default=None, description="failed jobs: status, title, detail and errors, as a problem"
    )


class JobList(BaseModel):
    jobs: list[JobInfo] = Field(description="the caller's jobs, newest first")
    next_cursor: str | None = Field(
        default=None, description="pass as ?cursor= for the next page; null on the last"
    )
