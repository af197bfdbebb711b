"""What a worker process does before it imports anything heavy (stdlib only): turn off the
search for pydantic plugins.

pydantic looks for plugins when it builds its first model (`pydantic.plugin._loader.
get_plugins`: `importlib.metadata.entry_points`, which reads the metadata of every installed
distribution). None is meant to run in a tool host or a pool worker, and the search cost each
of them 1.4 MB PSS of modules (importlib.metadata, email, zipfile, csv) and 30-45 ms of CPU at
start (tests/workers/test_worker_imports.py pins that they do without). pydantic's own switch,
`PYDANTIC_DISABLE_PLUGINS`, skips the search but still imports the loader and
importlib.metadata with it, so a loader that finds none stands in for pydantic's.

Used by `python -I -m workers` (workers/__main__.py) and the zygote, never by the
coordinator, whose plugins (if a user installed any) are its own business.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterable

__all__ = ["pydantic_plugins_off"]

_LOADER = "pydantic.plugin._loader"


def _no_plugins() -> Iterable[object]:
    return ()


def pydantic_plugins_off() -> None:
    """Make pydantic find no plugins in this process, without looking. Call before its first
    model is built; once pydantic has loaded its own loader this does nothing."""
    if _LOADER in sys.modules:
        return
    loader = types.ModuleType(_LOADER, "pydantic's plugin loader in a worker: no plugins")
    loader.get_plugins = _no_plugins  # type: ignore[attr-defined]
    sys.modules[_LOADER] = loader
