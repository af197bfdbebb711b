"""`python -m orchestrator.cli`: the same as the `warren` command."""

from orchestrator.cli import run_and_exit

run_and_exit()
