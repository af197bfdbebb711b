"""What a worker process does before it imports anything heavy (stdlib only): turn off the
search for pydantic plugins, and defer the modules its imports name but it never uses.

pydantic looks for plugins when it builds its first model (`pydantic.plugin._loader.
get_plugins`: `importlib.metadata.entry_points`, which reads the metadata of every installed
distribution). None is meant to run in a tool host or a pool worker, and the search cost each
of them 1.4 MB PSS of modules (importlib.metadata, email, zipfile, csv) and 30-45 ms of CPU at
start (tests/workers/test_worker_imports.py pins that they do without). pydantic's own switch,
`PYDANTIC_DISABLE_PLUGINS`, skips the search but still imports the loader and
importlib.metadata with it, so a loader that finds none stands in for pydantic's.

trio imports `ssl` (with OpenSSL, through `_ssl`), `hashlib`, `hmac` (OpenSSL's `_hashlib`)
and `idna` at start for its TLS streams, DTLS and host name lookups, and pydantic `secrets` for
comparing its secret types, none of which a worker uses: 1.5 MB PSS of each tool host; and
through `ctypes.util` (trio names its threads) `shutil`'s `bz2` and `lzma`, `tempfile` and
`subprocess`'s `locale`, which a worker uses seldom if ever: 0.4 MB more.
`defer_unused_modules` puts a stand-in for each in `sys.modules` (`_deferred`) that runs the
real module, into the same module object, on the first attribute anyone reads from it;
`import ssl` alone reads none, so the modules run only if a worker really uses them
(tests/workers/test_worker_imports.py pins that a tool host reaches `Ready` without running
them, tests/workers/test_lean.py that a deferred module still works).

Used by `python -I -m workers` (workers/__main__.py) and the zygote (plugins only), never by
the coordinator, whose plugins (if a user installed any) are its own business.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import threading
import types
from collections.abc import Iterable
from typing import Any

__all__ = ["UNUSED_MODULES", "defer_unused_modules", "pydantic_plugins_off"]

UNUSED_MODULES = ("ssl", "hashlib", "hmac", "idna", "secrets", "bz2", "lzma", "tempfile", "locale")
"""Modules a worker's imports (trio's, pydantic's) name at start but it seldom or never uses."""

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


def defer_unused_modules(names: Iterable[str] = UNUSED_MODULES) -> None:
    """Put a deferred stand-in (`_deferred`) for each of `names` not imported yet into
    `sys.modules`. Call before the imports that name them."""
    for name in names:
        if name not in sys.modules and (spec := importlib.util.find_spec(name)) is not None:
            sys.modules[name] = _deferred(spec)


def _deferred(spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
    """The module of `spec`, not run yet: its first missing attribute (a module `__getattr__`,
    PEP 562) runs its code into this same object, once, under a lock (threads may race to it),
    and is then looked up again. `__spec__`, `__name__` and the rest set from the spec are
    present, so the import system finds the module complete without running it."""
    module = importlib.util.module_from_spec(spec)
    lock = threading.RLock()

    def __getattr__(attr: str) -> Any:
        if attr == "__path__" and spec.submodule_search_locations is None:
            raise AttributeError(attr)  # `from M import x` asks; a plain module has none
        with lock:
            if module.__dict__.get("__getattr__") is __getattr__:
                del module.__dict__["__getattr__"]
                assert spec.loader is not None
                try:
                    spec.loader.exec_module(module)
                except BaseException:  # as a failed import: the module is not there
                    sys.modules.pop(spec.name, None)
                    raise
        return getattr(module, attr)

    setattr(module, "__getattr__", __getattr__)  # noqa: B010 (mypy: a module's method)
    return module
