"""Executor settings, read from `AGENT_REACH_EXECUTOR_*` environment variables."""

from __future__ import annotations

import os
import secrets
import socket
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, PositiveFloat, PositiveInt, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from agent_reach.addresses import split_address


def default_executor_id() -> str:
    """`host-pid-xxxx`: unique per process, readable in controller logs."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


class ExecutorSettings(BaseSettings):
    """How one executor process connects, how much it runs at once and how it shuts down."""

    model_config = SettingsConfigDict(env_prefix="AGENT_REACH_EXECUTOR_", frozen=True)

    controller: str = Field(
        default="127.0.0.1:50051",
        description="Controller gRPC HOST:PORT; several comma-separated, or dns:///NAME:PORT "
        "(a headless Service) to reach every replica, round robin.",
    )
    token: SecretStr | None = Field(
        default=None, description="The executor pool's token (`reach executors create-token`)."
    )
    tls_ca: Path | None = Field(
        default=None, description="CA certificate (PEM) of the controller: connect with TLS."
    )
    tls_cert: Path | None = Field(
        default=None, description="This executor's client certificate (PEM), for mutual TLS."
    )
    tls_key: Path | None = Field(default=None, description="Its private key (PEM).")
    tls_server_name: str | None = Field(
        default=None, description="Name to expect in the controller's certificate."
    )
    slots: PositiveInt = Field(default=8, description="Steps run at once.")
    connectors: Annotated[list[str] | None, NoDecode] = Field(
        default=None,
        description="Connector names to host (comma-separated in env); None hosts all installed.",
    )
    executor_id: str = Field(default_factory=default_executor_id)
    poll_wait: PositiveFloat = Field(default=10.0, description="Long-poll wait, in seconds.")
    pollers: PositiveInt = Field(
        default=2,
        description="Long polls kept open at once, sharing the free slots: while one answer "
        "travels back, another poll waits, ready to be handed the next step.",
    )
    stream: bool = Field(
        default=False,
        description="Send heartbeats, and polls and reports while this executor holds a step "
        "or two, as messages on Exchange streams, one per poller (cheaper per call; a busier "
        "executor calls unary, where faster answers would make smaller batches). Off by "
        "default: on two cores it gained nothing at one submitter and cost at eight "
        "(BENCHMARKS.md, issue 33 round ten); false: unary calls only.",
    )
    drain_grace: float = Field(
        default=30.0, ge=0, description="Seconds in-flight steps get to finish on shutdown."
    )
    reconnect_initial: PositiveFloat = Field(default=0.1, description="First backoff, seconds.")
    reconnect_maximum: PositiveFloat = Field(default=5.0, description="Backoff cap, seconds.")
    report_batch_max: PositiveInt = Field(default=256, description="Results per ReportResults.")
    rpc_timeout: PositiveFloat = Field(
        default=10.0, description="Deadline of Register, Heartbeat and ReportResults, seconds."
    )
    default_step_timeout: PositiveFloat = Field(
        default=300.0, description="Timeout of a step whose assignment carries none, seconds."
    )
    metrics: str | None = Field(
        default=None,
        description="Serve Prometheus metrics at http://HOST:PORT/metrics (port 0: any free "
        "port); off when unset.",
    )

    @model_validator(mode="after")
    def _check_tls(self) -> ExecutorSettings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together")
        if self.tls_cert is not None and self.tls_ca is None:
            raise ValueError("a client certificate needs tls_ca (mutual TLS is TLS)")
        return self

    @field_validator("metrics")
    @classmethod
    def _check_address(cls, value: str | None) -> str | None:
        if value:
            split_address(value)
        return value or None

    @field_validator("connectors", mode="before")
    @classmethod
    def _split_names(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value
