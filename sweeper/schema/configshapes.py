"""The config file's nested shapes (remediation, schedules, outside signals, the DCGM images, the
depth ladder) as pydantic models, built when a file is first checked: a command run without a
config file never imports pydantic, and starts faster. sweeper.config declares the keys."""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal

from sweeper.schema.declaration import duration_type

PINNED = r"^[a-z0-9][a-z0-9._/:-]*@sha256:[0-9a-f]{64}$"
PINNED_WORDS = "an image pinned by digest: name[:tag]@sha256:<64 hex>"


@functools.cache
def config_shapes() -> dict[str, Any]:
    """The nested shapes of the file as pydantic models, built when a file is first checked: a
    command run without a config file never imports pydantic, and starts faster."""
    from pydantic import BaseModel, ConfigDict, Field, Strict

    provider = Literal["karpenter", "asg", "manual"]

    class _Remediation(BaseModel):
        model_config = ConfigDict(extra="forbid")
        default: provider = "manual"  # type: ignore[valid-type]
        by_pool: dict[str, provider] = {}  # type: ignore[valid-type]
        by_profile: dict[str, provider] = {}  # type: ignore[valid-type]

    class _Schedule(BaseModel):
        model_config = ConfigDict(extra="forbid")
        name: Annotated[str, Strict(), Field(min_length=1)]
        cron: Annotated[str, Strict(), Field(min_length=1)]
        playbook: Annotated[str, Strict(), Field(min_length=1)] | None = None
        max_nodes: Annotated[int, Strict(), Field(ge=0)] | None = None
        interval: duration_type(gt=0) | None = None  # type: ignore[valid-type]
        dcgm_level: Annotated[int, Strict(), Field(ge=1, le=4)] | None = None

    class _Source(BaseModel):
        model_config = ConfigDict(extra="forbid")
        type: Literal["prometheus", "loki"]
        url: Annotated[str, Strict(), Field(min_length=1)]
        query: Annotated[str, Strict()] | None = None
        node_label: Annotated[str, Strict()] | None = None
        window: duration_type(gt=0) | None = None  # type: ignore[valid-type]
        timeout: duration_type(gt=0) | None = None  # type: ignore[valid-type]

    class _Rung(BaseModel):
        model_config = ConfigDict(extra="forbid")
        name: Annotated[str, Strict(), Field(min_length=1)]
        playbook: Annotated[str, Strict(), Field(min_length=1)]
        duration: duration_type(gt=0)  # type: ignore[valid-type]
        dcgm_level: Annotated[int, Strict(), Field(ge=1, le=4)] | None = None

    # `dcgm_images`: a CUDA major (YAML `12:` or `"12":`) to an image pinned by digest.
    cuda_images = dict[Annotated[int, Field(ge=11, le=99)], Annotated[str, Strict(), Field(pattern=PINNED)]]
    return {"remediation": _Remediation, "schedules": list[_Schedule], "suspect_sources": list[_Source],
            "dcgm_images": cuda_images, "depth_ladder": list[_Rung]}
