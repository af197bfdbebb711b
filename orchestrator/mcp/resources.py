"""`@server:uri` in a prompt: the resource, read through the server's client, joins the prompt.

One `@` grammar for prompts: `@path` names a file (the REPL completes it), `@server:uri` an MCP
resource of a configured server (`@docs:file:///guide.md`, `@github:repo://a/b/issues/1`). A
mention of a server that is not configured is left as text. Each resource is added as its own
context block after the prompt, bounded by `MAX_RESOURCE_CHARS`; one that cannot be read is
added as a note saying why, so the model knows it is missing.
"""

from __future__ import annotations

import re
from typing import Final

from orchestrator.mcp.servers import McpCallFailed, McpServers

__all__ = ["MAX_RESOURCE_CHARS", "MENTION", "resolve_mentions"]

MENTION: Final = re.compile(r"(?<![\w@])@(?P<server>[A-Za-z0-9_-]+):(?P<uri>\S+)")
MAX_RESOURCE_CHARS = 100_000
"""Characters of one resource put into the prompt; the rest is cut with a note."""
MAX_MENTIONS = 10


async def resolve_mentions(prompt: str, servers: McpServers) -> list[str]:
    """The context blocks for the resources `prompt` mentions (each once, at most
    `MAX_MENTIONS`)."""
    known = set(servers.names())
    seen: list[tuple[str, str]] = []
    for match in MENTION.finditer(prompt):
        key = (match["server"], match["uri"].rstrip(".,;:!?)]}'\""))
        if key[0] in known and key not in seen:
            seen.append(key)
    blocks = []
    for server, uri in seen[:MAX_MENTIONS]:
        try:
            text = await servers.read_resource(server, uri)
        except McpCallFailed as exc:
            text = f"(not read: {exc})"
        if len(text) > MAX_RESOURCE_CHARS:
            cut = len(text) - MAX_RESOURCE_CHARS
            text = text[:MAX_RESOURCE_CHARS] + f"\n[... {cut} more characters not shown]"
        blocks.append(f'<resource server="{server}" uri="{uri}">\n{text}\n</resource>')
    return blocks
