"""`python -m orchestrator.cli`: the same as the `warren` command."""

from orchestrator.cli.main import run_and_exit

run_and_exit()
