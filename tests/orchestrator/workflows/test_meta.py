"""`read_meta`: a workflow's META is read with `ast` alone, before anything runs, and every way
a script can get it wrong is one clear message (JavaScript gets the Python form)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from orchestrator.workflows.meta import PYTHON_FORM, WorkflowError, WorkflowMeta, read_meta


def meta_of(source: str) -> WorkflowMeta:
    return read_meta(textwrap.dedent(source))


def refusal(source: str) -> WorkflowError:
    with pytest.raises(WorkflowError) as caught:
        read_meta(textwrap.dedent(source))
    return caught.value


def test_a_good_meta_is_read() -> None:
    meta = meta_of(
        '''
        """Review the packages."""
        from __future__ import annotations
        META = {
            "name": "review-all",
            "description": "Review each package",
            "phases": ["Review", "Verify"],
        }
        phase("Review")
        finish(None)
        '''
    )
    assert meta == WorkflowMeta("review-all", "Review each package", ("Review", "Verify"))
    assert meta_of('META = {"name": "x", "description": ""}\n').phases == ()


def test_reading_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    meta_of(
        f"""
        META = {{"name": "x", "description": "d"}}
        open({str(marker)!r}, "w").write("ran")
        """
    )
    assert not marker.exists()


def test_a_missing_meta_is_refused_with_its_form() -> None:
    error = refusal('phase("Review")\nfinish(1)\n')
    assert "must begin with a META literal" in error.message
    assert 'META = {"name"' in error.message


def test_a_meta_that_is_not_first_is_refused_with_its_line() -> None:
    error = refusal(
        """
        import json
        META = {"name": "x", "description": "d"}
        """
    )
    assert error.line == 3
    assert "META (line 3) must be the script's first statement" in error.message


def test_a_computed_meta_is_refused() -> None:
    error = refusal('META = {"name": "x", "description": open("/etc/hostname").read()}\n')
    assert "must be a literal" in error.message and error.line == 1
    error = refusal('META = dict(name="x", description="d")\n')
    assert "must be a literal" in error.message


@pytest.mark.parametrize(
    ("meta", "expected"),
    [
        ('["x"]', "must be a dict, not list"),
        ('{"name": "x", "description": "d", "phase": ["A"]}', "unknown key 'phase'"),
        ('{"description": "d"}', "name must be a string"),
        ('{"name": "", "description": "d"}', "name must be a string"),
        ('{"name": "two words", "description": "d"}', "name must be a string"),
        ('{"name": "x"}', "description must be a string"),
        ('{"name": "x", "description": "d", "phases": "Review"}', "phases must be a list"),
        ('{"name": "x", "description": "d", "phases": ["A", 2]}', "phases must be a list"),
    ],
)
def test_a_meta_of_the_wrong_shape_says_what_is_wrong(meta: str, expected: str) -> None:
    assert expected in refusal(f"META = {meta}\n").message


def test_javascript_is_refused_with_the_python_form() -> None:
    error = refusal(
        """
        export const meta = { name: "review", description: "Review", phases: ["Review"] };
        const found = await parallel(pkgs.map(p => () => agent(`Review ${p}`)));
        """
    )
    assert "JavaScript" in error.message
    assert PYTHON_FORM in error.message
    error = refusal('META = {"name": "x", "description": "d"}\nconst x = await agent("hi");\n')
    assert PYTHON_FORM in error.message


def test_a_syntax_error_gives_its_line() -> None:
    error = refusal(
        """
        META = {"name": "x", "description": "d"}
        found = agent("a"
        finish(found)
        """
    )
    assert error.line is not None and error.line >= 3
    assert error.message.startswith(f"The workflow script has a syntax error at line {error.line}")
    assert "JavaScript" not in error.message
