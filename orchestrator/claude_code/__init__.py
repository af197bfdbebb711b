"""The Claude Code dialect: its flags, output shapes, SDK control protocol, agent definitions
and `--settings` read as Warren's (README.md); the name tables are `policies.claude_names`."""
