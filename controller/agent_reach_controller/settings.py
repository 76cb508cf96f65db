"""Controller settings (environment: AGENT_REACH_CONTROLLER_<FIELD>)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

DEFAULT_SQLITE = "sqlite:///.reach/reach.db"

# Where a tenant's tasks run (ARCHITECTURE.md, "Which environment does a task run in?"): `dev`
# as configured; `sandbox`, each write to its tool's sandbox target or refused; `prod`, each
# write waiting for a person unless its tool is exempted.
Environment = Literal["dev", "sandbox", "prod"]
DEFAULT_ENVIRONMENT: Environment = "dev"


class ControllerSettings(BaseSettings):
    """How a controller process is wired: its listeners, storage and lease timings."""

    model_config = SettingsConfigDict(env_prefix="AGENT_REACH_CONTROLLER_", extra="ignore")

    http: str = Field("127.0.0.1:8080", description="REST listener HOST:PORT (port 0: any)")
    grpc: str = Field("127.0.0.1:50051", description="gRPC listener HOST:PORT (port 0: any)")
    tools: Annotated[list[Path], NoDecode] = Field(
        default_factory=list, description="Tool definition YAML files (comma-separated in env)"
    )
    database_url: SecretStr = SecretStr(DEFAULT_SQLITE)
    policy: Path | None = Field(
        None, description="Permission matrix YAML (roles → tool patterns → actions)"
    )
    bootstrap_key: SecretStr | None = Field(
        None,
        description="An extra admin key (tenant 'default') for creating the first real keys; "
        "unset it once they exist",
    )
    redis_url: SecretStr | None = None
    environment: Environment = Field(
        DEFAULT_ENVIRONMENT,
        description="Where tenants' tasks run unless the policy gives a tenant its own: 'dev'; "
        "'sandbox' (writes go to each tool's sandbox target, or are refused); 'prod' (every "
        "write waits for approval unless its tool is exempted)",
    )
    migrate: bool = Field(False, description="Apply database migrations at start")
    lease_seconds: float = Field(
        6.0,
        gt=0,
        description="How long an executor's leases outlive its last heartbeat (it beats every "
        "quarter of this): a dead executor's steps run elsewhere about this long after it died",
    )
    executor_auth: str = Field(
        "token",
        pattern="^(token|off)$",
        description="'token': executors must present a pool token (or a client certificate); "
        "'off': executors without one may run anything (only for a rolling upgrade from a "
        "release without executor tokens)",
    )
    tls_cert: Path | None = Field(
        None, description="Serve REST and gRPC over TLS with this certificate (PEM)"
    )
    tls_key: Path | None = Field(None, description="The certificate's private key (PEM)")
    grpc_client_ca: Path | None = Field(
        None,
        description="Mutual TLS on gRPC: executors must present a certificate this CA signed; "
        "a URI SAN urn:agent-reach:pool:<name> makes it a member of that pool (no token needed)",
    )
    executor_tokens: Path | None = Field(
        None,
        description="Provisioned executor pools: YAML {tokens: [{name, sha256, connectors, "
        "tools, tenant}]} holding only the SHA-256 of each token (a Kubernetes Secret)",
    )
    max_poll_wait_seconds: float = Field(20.0, gt=0)
    reap_interval_seconds: float = Field(1.0, gt=0)
    max_wait_seconds: float = Field(300.0, gt=0, description="Longest ?wait on submit")
    retention_days: float = Field(
        0.0,
        ge=0,
        description="Delete finished tasks (with their steps, events, charges and idempotency "
        "keys) and done webhook deliveries this many days after they finished; 0 keeps "
        "everything. The audit log is kept whole.",
    )
    audit_retention_days: float = Field(
        0.0,
        ge=0,
        description="Remove sealed audit entries this many days old, behind a checkpoint the "
        "chain is verified from; 0 keeps the whole log",
    )
    memory_per_subject: int = Field(
        1000, ge=1, le=100_000, description="Long-term memories one subject may hold"
    )
    memory_retention_days: float = Field(
        0.0,
        ge=0,
        description="Delete memories not updated for this many days (really deleted, as a "
        "forget is); 0 keeps them until they expire or are forgotten. Task retention never "
        "touches memory",
    )
    memory_key: SecretStr | None = Field(
        None,
        description="The key of the HMACs that name a subject or a memory's text in the audit "
        "log (32+ bytes, hex or text); unset, one is made and kept in the database",
    )
    retention_batch: int = Field(
        500, ge=1, le=10_000, description="Tasks deleted per retention transaction"
    )
    mcp: bool = Field(
        True,
        description="Serve each key's tools over MCP at /mcp; false: no /mcp, and the MCP SDK "
        "(about 24 MiB of a controller's memory) is never imported",
    )
    shutdown_delay: float = Field(
        0.0,
        ge=0,
        le=300,
        description="Seconds to keep serving after SIGTERM with /readyz (and gRPC health) saying "
        "not ready, so load balancers and Kubernetes endpoints stop sending before the listeners "
        "close (a few seconds behind a load balancer; 0 for a process of its own)",
    )
    max_event_streams: int = Field(
        100, ge=1, description="Live event streams (SSE) one replica serves at once; more get 429"
    )
    event_stream_max_seconds: float = Field(
        3600.0,
        gt=0,
        description="A live event stream is closed after this long; the client resumes with "
        "Last-Event-ID",
    )
    event_stream_heartbeat_seconds: float = Field(
        15.0, gt=0, description="A comment line after this much silence keeps proxies from closing"
    )
    max_body_bytes: int = Field(1024 * 1024, gt=0)
    http_keep_alive_seconds: int = Field(
        75,
        ge=1,
        description="Close an idle HTTP connection after this long: longer than clients and "
        "load balancers keep theirs, so that they, never the server, close it (else a request "
        "sent as the server closes is lost)",
    )
    receipt_budget_chars: int = Field(2000, ge=200)
    max_queued_steps: int | None = Field(
        None, ge=1, description="Refuse submits (429) while more steps than this wait"
    )
    overload_retry_after_seconds: int = Field(5, ge=1)
    approval_timeout_seconds: float = Field(
        3600.0,
        gt=0,
        description="A step waiting for approval (dangerous, or a write in prod) and not approved "
        "within this is rejected",
    )
    approval_webhook_url: SecretStr | None = Field(
        None,
        description="POST each approval request here (Standard Webhooks; retried until it "
        "answers 2xx or the approval expires)",
    )
    approval_webhook_secret: SecretStr | None = Field(
        None, description="Signing secret for the webhook, 'whsec_' + base64 (Standard Webhooks)"
    )
    task_webhook_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Hosts a submit's `webhook.url` may name, as patterns ('hooks.example.com', "
        "'*.internal.example'); each task's end is POSTed there, signed (Standard Webhooks). "
        "Empty: task webhooks are refused (comma-separated in env)",
    )
    task_webhook_secret: SecretStr | None = Field(
        None,
        description="Signing secret for task webhooks, 'whsec_' + base64 (Standard Webhooks); "
        "needed with task_webhook_hosts",
    )
    separation_of_duties: bool = Field(
        True, description="Whoever submitted a task may not approve its steps"
    )
    console: bool = Field(True, description="Serve the web console at /console")
    console_session_seconds: int = Field(
        3600, ge=60, le=86400, description="How long a console sign-in lasts"
    )
    console_secure_cookie: Literal["auto", "always", "never"] = Field(
        "auto",
        description="The session cookie's Secure flag: 'auto' sets it on requests that came over "
        "HTTPS; 'always' where TLS ends at an ingress in front of the controller",
    )
    console_proxy_header: str | None = Field(
        None,
        description="Sign people in by this header of a trusted authenticating proxy "
        "(e.g. X-Forwarded-User); off when unset",
    )
    console_proxy_trusted: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["127.0.0.1/32", "::1/128"],
        description="Addresses (CIDR) the proxy calls from; the header from any other is ignored "
        "(comma-separated in env)",
    )
    console_proxy_users: Path | None = Field(
        None,
        description="YAML `users: {name: {tenant, roles}}`: whom the proxy may sign in",
    )
    jaeger_url: str | None = Field(
        None,
        description="Link from a task to its trace, with {trace_id} in it "
        "(e.g. https://jaeger.example/trace/{trace_id})",
    )
    max_tasks_in_flight_per_principal: int | None = Field(
        None, ge=1, description="Refuse submits (429) from a caller with this many unfinished tasks"
    )
    db_pool_size: int = Field(10, ge=1)
    workers: int = Field(
        1,
        ge=1,
        le=64,
        description="Processes serving REST and gRPC on the same ports (Postgres only)",
    )
    reuse_port: bool = Field(
        False,
        description="Bind with SO_REUSEPORT, so that sibling processes share the ports "
        "(set for each process of --workers)",
    )
    db_prepare: bool = Field(
        True,
        description="Prepare the hot path's statements on each Postgres connection; turn off "
        "behind a pooler in transaction mode that does not track prepared statements",
    )
    hand_off: bool = Field(
        True,
        description="Lease a new task's ready steps straight to executors waiting on this "
        "replica, in the submit's transaction (Postgres; tools without caps, breakers or rate "
        "limits): one commit and one statement fewer per step",
    )
    ready_file: Path | None = Field(None, description="Write bound ports here as JSON once up")
    log_format: str = Field("json", pattern="^(json|text)$")
    log_level: str = "INFO"

    @model_validator(mode="after")
    def _check_tls(self) -> ControllerSettings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together")
        if self.grpc_client_ca is not None and self.tls_cert is None:
            raise ValueError("grpc_client_ca (mutual TLS) needs tls_cert and tls_key")
        if self.console_proxy_header and self.console_proxy_users is None:
            raise ValueError("console_proxy_header needs console_proxy_users: who it may sign in")
        if self.jaeger_url is not None and "{trace_id}" not in self.jaeger_url:
            raise ValueError("jaeger_url needs {trace_id} where the trace id goes")
        if self.task_webhook_hosts and self.task_webhook_secret is None:
            raise ValueError("task_webhook_hosts needs task_webhook_secret: deliveries are signed")
        return self

    @field_validator("task_webhook_hosts", "console_proxy_trusted", mode="before")
    @classmethod
    def _split_hosts(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("tools", mode="before")
    @classmethod
    def _split_paths(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value
