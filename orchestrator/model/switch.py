"""A model client whose model can change between requests: Claude Code's `set_model`, which an
SDK host sends to switch the model of the session it drives
(orchestrator/claude_code/sdk_control.py).

`SwitchableModel` sits under the broker, so budgets and concurrency limits hold whatever model
answers, and subagents whose type says nothing (or `inherit`) follow the switch. A request
streams from the model chosen when it started; a switch applies from the next request. Every
client it made is kept (switching back costs nothing) and closed with it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from orchestrator.model.base import ModelClient, ModelEvent, ModelRequest
from orchestrator.model.catalog import ALIASES, UNKNOWN_MODEL, model_info, resolve_model

__all__ = ["SwitchableModel", "known_model"]


def known_model(name: str) -> str:
    """The model id `name` stands for, if Warren knows it: an alias (`sonnet`, repointed by
    its environment variable if set), an id of the model table, or a Claude model id
    (`claude-...`, newer than the table).

    **Errors:** `ValueError` naming it and the aliases.
    """
    if name.strip().lower() in ALIASES or name.startswith("claude-"):
        return resolve_model(name)
    if model_info(name) is not UNKNOWN_MODEL:
        return name
    raise ValueError(
        f"no model {name!r}; name an alias ({', '.join(ALIASES)}) or a Claude model id"
    )


class SwitchableModel:
    """A `ModelClient` that streams from the session's model until `select` names another.

    **Cancellation:** as the client streaming.
    **Errors:** that client's.
    """

    def __init__(self, client: ModelClient, make: Callable[[str], ModelClient]) -> None:
        """`make`: a client for a model id (the session's own kind: fallback included)."""
        self._default = client
        self._client = client
        self._make = make
        self._clients: dict[str, ModelClient] = {client.model: client}

    @property
    def model(self) -> str:
        return self._client.model

    def select(self, name: str | None) -> str:
        """Answer the next requests with `name` (an alias or id; None or `default`: the
        session's own model); the model id chosen.

        **Errors:** `ValueError` for a model Warren does not know (`known_model`).
        """
        if name is None or name == "default":
            self._client = self._default
            return self._client.model
        model = known_model(name)
        if model not in self._clients:
            self._clients[model] = self._make(model)
        self._client = self._clients[model]
        return model

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        return self._client.stream(request)

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()
