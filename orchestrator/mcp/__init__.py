"""MCP client: servers beside the session, their tools through the pipeline (see README.md)."""
