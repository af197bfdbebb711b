"""Hooks: commands a policy runs at points of a run, with Claude Code's semantics, under the
floor. `events` (what a hook reads), `output` (what it says), `matchers` (which calls it
sees), `runner` (running and merging), `build` (the session's runner from its policy)."""
