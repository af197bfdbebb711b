"""Running subagents on other machines: what the coordinator ships to a node, and how."""
