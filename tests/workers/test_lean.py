"""`workers.lean.defer_unused_modules`: a deferred module is not run by `import`, and is the
real module, whole, from the first attribute anyone reads (each case in a fresh interpreter,
started as a worker is: `python -I`, so the test's own imports cannot have run it first)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r})\n{code}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    return done.stdout


def test_a_deferred_module_runs_on_its_first_attribute_and_then_works_whole() -> None:
    out = _run(
        "from workers.lean import defer_unused_modules\n"
        "defer_unused_modules(('ssl', 'idna'))\n"
        "import ssl, idna\n"
        "print('_ssl' in sys.modules, 'idna.core' in sys.modules)\n"
        "from ssl import SSLContext, PROTOCOL_TLS_CLIENT\n"
        "context = SSLContext(PROTOCOL_TLS_CLIENT)\n"
        "made = ssl.create_default_context()\n"
        "print('_ssl' in sys.modules, context.check_hostname, made.verify_mode > 0)\n"
        "print(idna.encode('bücher.example').decode(), sys.modules['ssl'] is ssl)\n"
        "print(hasattr(ssl, 'no_such_name'), '__getattr__' in vars(ssl))\n"
    )
    assert out.splitlines() == [
        "False False",
        "True True True",
        "xn--bcher-kva.example True",
        "False False",
    ]


def test_a_module_already_imported_or_absent_is_left_as_it_is() -> None:
    out = _run(
        "import json\n"
        "from workers.lean import defer_unused_modules\n"
        "defer_unused_modules(('json', 'no_such_module_anywhere'))\n"
        "print('__getattr__' in vars(json), 'no_such_module_anywhere' in sys.modules)\n"
    )
    assert out.splitlines() == ["False False"]
