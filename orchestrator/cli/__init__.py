"""The `warren` command: the one composition root, where flags become a `Session` and the
orchestrator is wired to the sandbox, the tool hosts, the worker pool and the broker.

    main.py      the command line: `warren [PROMPT]`, `-p`, and the subcommands
    run.py       a headless run: a Session, its result, signals and the exit code
    wiring.py    the concrete parts a session gets (tool hosts, worker pool, broker)
    doctor.py    `warren doctor` and `warren sandbox run`: what sandbox/ returns, printed
    policy.py    `warren policy ...`, `warren trust`, `warren untrust`
    hooks.py     `warren hooks list`, `warren hooks test`
    sessions.py  `warren sessions`, and the picker of `warren --resume` without an id
    client.py    the thin client: a run handed to the warm server (standard library only)
    server.py    `warren server`: the per-user server that forks a session process per run

Entry point: `warren = "orchestrator.cli:run_and_exit"` (pyproject.toml).
"""

from orchestrator.cli.main import main, run_and_exit

__all__ = ["main", "run_and_exit"]
