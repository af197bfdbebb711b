"""Small structured-concurrency helpers shared across the orchestrator."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TypeVar

__all__ = ["closing_iter"]

T = TypeVar("T")


@asynccontextmanager
async def closing_iter(iterator: AsyncIterator[T]) -> AsyncIterator[AsyncIterator[T]]:
    """`contextlib.aclosing` for any async iterator: closes it if it can be closed.

    Tools and model clients are typed as returning `AsyncIterator`; their async generators
    must still be closed deterministically (trio forbids leaving them to the GC).
    """
    try:
        yield iterator
    finally:
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            await aclose()
