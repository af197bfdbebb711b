"""Claude Code's agent definitions read as Warren's: the front matter of `.claude/agents/*.md`
and an SDK host's `AgentDefinition`s (its `initialize`'s `agents`), as the fields of Warren's
`AgentType` (orchestrator/agents/types.py, which validates them, loads the files and says
which directories are read).

Claude Code's meaning of a definition holds for them: no `tools` means every tool (but
`dispatch_agent`: a subagent does not dispatch), which makes a writable type; any tool besides
the read-only ones does too; `Task` / `Agent` are `dispatch_agent`; `model: inherit` is the
session's model; `disallowedTools` are taken out. A key Warren does not have
(`permissionMode`, `skills`, ...) is an error naming it, never ignored. An SDK definition's
`prompt` is the system prompt and its `maxTurns` the turn limit.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, Final

from orchestrator.errors import ConfigError
from orchestrator.tools.registry import STATELESS_TOOLS
from policies.claude_names import SUBAGENT_TOOL, warren_tool

__all__ = [
    "CLAUDE_AGENT_KEYS",
    "SDK_AGENTS",
    "agent_fields",
    "claude_agents_dir",
    "sdk_agent_fields",
]

CLAUDE_AGENT_KEYS: Final = frozenset({"name", "description", "tools", "disallowedTools", "model"})
"""Claude Code's front matter keys that Warren maps (besides those every definition may carry
and Warren ignores, as `color`)."""
_SDK_KEYS: Final = {
    "description": "description",
    "prompt": "system_prompt",
    "maxTurns": "max_turns",
}
"""An SDK `AgentDefinition`'s keys besides Claude Code's front matter ones, as Warren's."""
SDK_AGENTS: Final = "SDK host (initialize agents)"
"""Where messages say an SDK-defined agent type comes from."""


def claude_agents_dir(env: Mapping[str, str] | None = None) -> Path:
    """The user's Claude Code agents: `$CLAUDE_CONFIG_DIR/agents`, else `~/.claude/agents`."""
    # Imported when asked: the policy's settings modules (20 ms) are loaded by then in a
    # session, which reads its policy first; an importer of `AgentType` alone needs none.
    from policies.claude_settings import claude_config_dir

    return claude_config_dir(env) / "agents"


def agent_fields(
    fields: dict[str, Any], where: Path | str, all_tools: Collection[str]
) -> dict[str, Any]:
    """Claude Code's front matter (`tools` already a list when it was a comma-separated
    string) as Warren's `AgentType` fields; `all_tools` is what no `tools` key stands for.

    **Errors:** `ConfigError` naming `where` for a key Warren does not read or a bad list.
    """
    unknown = sorted(set(fields) - CLAUDE_AGENT_KEYS)
    if unknown:
        raise ConfigError(
            f"{', '.join(unknown)}: not an agent key Warren supports (it reads name, "
            "description, tools, disallowedTools, model)",
            source=str(where),
        )
    out = {k: v for k, v in fields.items() if k != "disallowedTools"}
    every = [t for t in all_tools if t != SUBAGENT_TOOL]
    tools = out.get("tools", every)
    if not isinstance(tools, list) or not all(isinstance(t, str) for t in tools):
        raise ConfigError("tools: a comma-separated list of tool names", source=str(where))
    denied = fields.get("disallowedTools", [])
    if isinstance(denied, str):
        denied = [t.strip() for t in denied.split(",") if t.strip()]
    if not isinstance(denied, list):
        raise ConfigError("disallowedTools: a list of tool names", source=str(where))
    named = [warren_tool(t) for t in tools]
    kept = tuple(t for t in named if t != SUBAGENT_TOOL and t not in denied)
    out["tools"] = kept
    out["writable"] = any(t not in STATELESS_TOOLS for t in kept)
    if out.get("model") == "inherit":
        del out["model"]
    return out


def sdk_agent_fields(definition: object, where: str, all_tools: Collection[str]) -> dict[str, Any]:
    """One `AgentDefinition` of an SDK host's `initialize` as Warren's `AgentType` fields
    (without its name), read as `.claude/agents` are (`agent_fields`).

    **Errors:** `ConfigError` naming `where` for a field Warren has no meaning for
    (`skills`, `mcpServers`, `permissionMode`, ...) or a definition that is not an object.
    """
    if not isinstance(definition, Mapping):
        raise ConfigError("an agent definition is an object", source=where)
    given = {key: value for key, value in definition.items() if value is not None}
    fields = {k: v for k, v in given.items() if k not in _SDK_KEYS}
    if isinstance(fields.get("tools"), str):
        fields["tools"] = [t.strip() for t in fields["tools"].split(",") if t.strip()]
    unknown = sorted(set(fields) - CLAUDE_AGENT_KEYS)
    if unknown:
        raise ConfigError(
            f"{', '.join(unknown)}: not an agent field Warren supports (it reads "
            "description, prompt, tools, disallowedTools, model, maxTurns)",
            source=where,
        )
    fields = agent_fields(fields, where, all_tools)
    fields.update({_SDK_KEYS[k]: v for k, v in given.items() if k in _SDK_KEYS})
    return fields
