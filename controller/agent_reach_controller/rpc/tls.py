"""TLS on the gRPC listener, and mutual TLS where a client certificate names its executor pool.

A certificate names a pool with a URI subject alternative name `urn:agent-reach:pool:<name>`
(cert-manager's `uris:` field issues one); the pool's scope is that of the provisioning-file
entry, or the newest live token, of that name. Only certificates signed by `grpc_client_ca` are
accepted at all: the TLS handshake refuses a missing, expired or foreign certificate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc

POOL_URI_PREFIX = "urn:agent-reach:pool:"


def server_credentials(
    *, cert: Path, key: Path, client_ca: Path | None = None
) -> grpc.ServerCredentials:
    """TLS with this certificate; with `client_ca`, every client must present one it signed."""
    return grpc.ssl_server_credentials(
        [(key.read_bytes(), cert.read_bytes())],
        root_certificates=client_ca.read_bytes() if client_ca is not None else None,
        require_client_auth=client_ca is not None,
    )


def peer_pool(context: Any) -> str | None:
    """The pool a call's verified client certificate names, if any."""
    auth = context.auth_context() or {}
    for raw in auth.get("x509_subject_alternative_name", ()):
        value = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
        if value.startswith(POOL_URI_PREFIX) and len(value) > len(POOL_URI_PREFIX):
            return value[len(POOL_URI_PREFIX) :]
    return None
