"""HOST:PORT listen addresses, as every process's settings spell them."""

from __future__ import annotations


def split_address(address: str) -> tuple[str, int]:
    """'HOST:PORT' → (host, port); IPv6 hosts may be bracketed, an empty host is 127.0.0.1."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


class ListenError(OSError):
    """A listener could not be opened (the address is taken, or not this machine's): said in
    one line by the `reach` command, never as a traceback."""
