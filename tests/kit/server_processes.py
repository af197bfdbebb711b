"""The processes of a test's private `warren server`: every one started with its directory as
`WARREN_SERVER_DIR` (the server and each session it forked), found by their environment."""

from __future__ import annotations

import os
from pathlib import Path

import psutil


def servers_in(directory: Path) -> list[psutil.Process]:
    """The live processes whose environment names `directory` as their server's (this test
    process left out)."""
    found = []
    for process in psutil.process_iter(["environ"]):
        try:
            environ = process.info["environ"] or {}
        except psutil.Error:
            continue
        if environ.get("WARREN_SERVER_DIR") == str(directory) and process.pid != os.getpid():
            found.append(process)
    return found
