"""A controller that does not serve MCP does not load its SDK (about 24 MiB of memory)."""

from __future__ import annotations

import subprocess
import sys


def test_the_app_module_does_not_import_the_mcp_sdk() -> None:
    probe = (
        "import sys, agent_reach_controller.api.app, agent_reach_controller.server; "
        "print(sorted(m for m in sys.modules if m == 'mcp' or m.startswith('mcp.')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]", done.stdout
