"""The CEL engine (the `common-expression-language` package), imported without its command line.

The package's `__init__` imports its interactive shell (typer, rich, prompt_toolkit, pygments:
~20 MiB in every process that evaluates CEL, for a shell nothing here runs). A placeholder for
`cel.cli`, put in place before the package is first imported, keeps that out; the engine and its
standard library load as usual.
"""

from __future__ import annotations

import sys
import types

sys.modules.setdefault("cel.cli", types.ModuleType("cel.cli"))

import cel  # noqa: E402 - after the placeholder, on purpose

__all__ = ["cel"]
