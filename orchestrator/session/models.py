"""The session's model: the client the config names, wrapped in what the session needs.

From the inside out: the client (a Claude model, or a scripted replay), the fallback model
that answers once it is overloaded (`--fallback-model`), the switch an SDK host's `set_model`
turns (`Session.set_model`), and the broker that enforces `Limits` for every agent (budgets,
concurrency), which the composition root plugs in.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.limits import Limits
from orchestrator.model.base import ModelClient
from orchestrator.session.config import SessionConfig, SessionParts

if TYPE_CHECKING:
    from orchestrator.model.switch import SwitchableModel

__all__ = ["SessionModel", "build_model", "make_model"]


def make_model(name: str, cwd: Path) -> ModelClient:
    """The model client a config names: a Claude model, or a scripted replay."""
    if name.startswith("scripted:"):
        from orchestrator.model.scripted import ScriptedModel

        path = Path(name.removeprefix("scripted:")).expanduser()
        if not path.is_absolute():
            path = Path.cwd() / path
        return ScriptedModel.from_file(path, variables={"workspace": str(cwd)})
    from orchestrator.model.anthropic import AnthropicModel

    return AnthropicModel(model=name)


def _with_fallback(config: SessionConfig, model: ModelClient, cwd: Path) -> ModelClient:
    """`model` answering with the session's fallback once it is overloaded, when there is
    one and it is another model."""
    if config.fallback_model is None or config.fallback_model == model.model:
        return model
    from orchestrator.model.fallback import FallbackModel

    return FallbackModel(model, make_model(config.fallback_model, cwd))


def _host_model(config: SessionConfig, name: str, cwd: Path) -> ModelClient:
    """A client for another model than the session's (an SDK host switched to it, or an agent
    type names it), with the session's fallback."""
    return _with_fallback(config, make_model(name, cwd), cwd)


@dataclass(frozen=True)
class SessionModel:
    """The session's model as its requests go out, and the switch inside it (None unless an
    SDK host drives the session)."""

    model: ModelClient
    switch: SwitchableModel | None


def build_model(
    config: SessionConfig, parts: SessionParts, client: ModelClient, limits: Limits, cwd: Path
) -> SessionModel:
    """`client` (the config's or the injected one) with the fallback, the host's switch and
    the broker around it."""
    model = _with_fallback(config, client, cwd)
    switch: SwitchableModel | None = None
    if parts.host is not None:
        from orchestrator.model.switch import SwitchableModel

        model = switch = SwitchableModel(model, lambda name: _host_model(config, name, cwd))
    if parts.broker is not None:
        # An agent type's `model` is sent to the API; a scripted or injected model is the
        # only one there is and answers every agent.
        scripted = parts.model is not None or config.model.startswith("scripted:")
        client_for = None if scripted else (lambda name: _host_model(config, name, cwd))
        model = parts.broker(model, limits, client_for)
    return SessionModel(model, switch)
