"""API keys: `ark_<key id>_<secret>`, shown once, stored as a SHA-256 of the secret.

The key id is public (it names the key in listings and logs); the secret is 32 random bytes.
A fast hash is the right one here: with 256 bits of entropy nothing can be guessed, so a slow
password hash (bcrypt, argon2) would only add milliseconds to every request.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

# API keys; executor pool tokens (`identity/pools.py`) and executor session credentials
# (`state/sessions.py`) have the same shape under their own prefix.
API_KEY_PREFIX = "ark"
POOL_TOKEN_PREFIX = "rxt"
SESSION_PREFIX = "xs"
_PATTERNS = {
    prefix: re.compile(rf"^{prefix}_([0-9a-f]{{12}})_([A-Za-z0-9_-]{{43}})$")
    for prefix in (API_KEY_PREFIX, POOL_TOKEN_PREFIX, SESSION_PREFIX)
}


@dataclass(frozen=True, slots=True)
class NewKey:
    key_id: str
    secret_hash: str
    token: str  # the whole key, to show once; never stored

    def under(self, key_id: str) -> str:
        """The same secret under another id: a record that keeps its id gets a new secret."""
        prefix, _, secret = self.token.split("_", 2)
        return f"{prefix}_{key_id}_{secret}"


def new_key(prefix: str = API_KEY_PREFIX) -> NewKey:
    key_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    return NewKey(
        key_id=key_id, secret_hash=hash_secret(secret), token=f"{prefix}_{key_id}_{secret}"
    )


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def parse(token: str, prefix: str = API_KEY_PREFIX) -> tuple[str, str] | None:
    """(key id, secret) of a well-formed key (or token) with this prefix, else None."""
    match = _PATTERNS[prefix].match(token.strip())
    return (match.group(1), match.group(2)) if match else None


def matches(secret: str, stored_hash: str) -> bool:
    """Whether `secret` is the one `stored_hash` was made from (constant time)."""
    return hmac.compare_digest(hash_secret(secret), stored_hash)
