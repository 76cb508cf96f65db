"""`reach health` (also `python -m agent_reach_cli.health`, which loads nothing else): exit 0 when
a health URL answers 2xx, 1 otherwise. For container health checks: the controller's `/healthz`
by default, or an executor's metrics listener (`AGENT_REACH_HEALTH_URL`)."""

from __future__ import annotations

import argparse
import os
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence

ENV_URL = "AGENT_REACH_HEALTH_URL"
DEFAULT_URL = "http://127.0.0.1:8080/healthz"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help=f"what to ask (default ${ENV_URL}, else {DEFAULT_URL})")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds (default 3)")
    p.add_argument(
        "--no-verify",
        action="store_true",
        help="accept any TLS certificate (a local check of a listener whose certificate names "
        "the service, not 127.0.0.1)",
    )


def check(args: argparse.Namespace) -> int:
    url = args.url or os.environ.get(ENV_URL) or DEFAULT_URL
    context = None
    if args.no_verify:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=args.timeout, context=context) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (urllib.error.URLError, OSError) as exc:
        print(f"unhealthy: {url}: {getattr(exc, 'reason', exc)}", file=sys.stderr)
        return 1
    if not 200 <= status < 300:
        print(f"unhealthy: {url} answered {status}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="reach health", description=__doc__)
    add_arguments(p)
    return check(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
