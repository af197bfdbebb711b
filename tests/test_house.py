"""The house's rules, held against the code's own imports and definitions (tests/kit/house.py;
`python -m tests.kit.house` prints the numbers): no import circle anywhere, imports inside
functions and under TYPE_CHECKING included; `orchestrator/`'s root a short index; the front end
a part the engine never imports, and the composition root the only module of `orchestrator/`
that knows `workers/`; no function over 150 lines; each of Claude Code's spellings written in
one module (policies/claude_names.py)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.kit import house


@pytest.fixture(scope="module")
def found() -> dict[str, house.Module]:
    return house.modules()


def test_no_import_circle(found: dict[str, house.Module]) -> None:
    assert house.circles(found) == []


def test_the_orchestrator_root_is_a_short_index() -> None:
    roots = house.root_modules()
    assert len(roots) <= 12, roots


def test_the_layers_hold(found: dict[str, house.Module]) -> None:
    assert house.layer_breaches(found) == []


def test_no_function_over_150_lines(found: dict[str, house.Module]) -> None:
    assert house.long_functions(found, 150) == []


def test_claude_codes_spellings_are_written_once(found: dict[str, house.Module]) -> None:
    names = house.claude_code_names(found)
    assert set(names) == house.CLAUDE_CODE_NAMES
    assert all(mods == ["policies.claude_names"] for mods in names.values()), names


def _module(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path.joinpath(*name.split(".")).with_suffix(".py")
    path.parent.mkdir(parents=True, exist_ok=True)
    for parent in path.parents:
        if parent == tmp_path:
            break
        (parent / "__init__.py").touch()
    path.write_text(textwrap.dedent(text))


def test_the_measures_see_what_they_claim_to(tmp_path: Path) -> None:
    """A circle closed only inside a function or under TYPE_CHECKING is a circle; the engine
    importing the front end, a module other than the composition root importing workers/ and
    a second table of Claude Code's names are each found."""
    _module(tmp_path, "sandbox.a", "def f():\n    from sandbox import b\n")
    _module(tmp_path, "sandbox.b", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                   "    from sandbox.a import f\n")  # fmt: skip
    _module(tmp_path, "policies.p", "NAMES = {'Task': 'dispatch_agent'}\n")
    _module(tmp_path, "orchestrator.loop", "from orchestrator.cli import main\n")
    _module(tmp_path, "orchestrator.cli.main", "import workers.pool\n")
    _module(tmp_path, "workers.pool", "")
    found = house.modules(tmp_path)
    assert house.circles(found) == [["sandbox.a", "sandbox.b"]]
    assert sorted(house.layer_breaches(found)) == [
        "orchestrator.cli.main -> workers.pool (only the composition root)",
        "orchestrator.loop -> orchestrator.cli.main (the engine imports the front end)",
    ]
    assert house.claude_code_names(found) == {"Task": ["policies.p"]}
