"""Glob, Grep and LS over real trees with the real ripgrep."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from orchestrator.tools.base import ToolContext
from orchestrator.tools.glob import MAX_GLOB_RESULTS, GlobPlan, GlobTool, plan_glob
from orchestrator.tools.grep import MAX_GREP_LINES, GrepTool
from orchestrator.tools.ls import MAX_LS_ENTRIES, LSTool
from tests.orchestrator.tools.conftest import run_tool

GLOB = GlobTool()
GREP = GrepTool()
LS = LSTool()


def _tree(root: Path, files: dict[str, str]) -> None:
    """Create `files`, giving each a distinct mtime in the order listed (oldest first)."""
    for i, (rel, content) in enumerate(files.items()):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        os.utime(path, ns=(1_000_000_000_000_000_000 + i * 10**9,) * 2)


@pytest.fixture
def repo(ws: Path) -> Path:
    _tree(
        ws,
        {
            ".gitignore": "build/\n*.log\nsecret.py\n",
            "src/app.py": "import os\n\ndef main():\n    return os.getcwd()\n",
            "src/util/helpers.py": "def helper():\n    return 'TODO'\n",
            "src/web/page.ts": "export const TODO = 1;\n",
            "src/web/trace.log": "TODO ignored by *.log\n",
            "tests/test_app.py": "from src.app import main\n# TODO write tests\n",
            "build/gen.py": "# TODO generated\n",
            "debug.log": "TODO in a log\n",
            "secret.py": "TODO = 'ignored file'\n",
            ".github/workflows/ci.yml": "on: push  # TODO\n",
            ".git/config": "[core] TODO\n",
            "README.md": "# Project\nTODO: docs\n",
        },
    )
    return ws


# --- Glob -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "plan"),
    [
        ("*.py", GlobPlan("", "*.py", None, None)),
        ("**/*.py", GlobPlan("", "*.py", None, None)),
        ("src/*.py", GlobPlan("src", "*.py", 1, None)),
        ("src/**/*.{ts,tsx}", GlobPlan("src", "*.{ts,tsx}", None, None)),
        ("./src/app.py", GlobPlan("src", "app.py", 1, None)),
        ("src/**", GlobPlan("src", "*", None, None)),
        ("src/*/test_*.py", GlobPlan("src", None, None, "*/test_*.py")),
        ("**/tests/*.py", GlobPlan("", None, None, "**/tests/*.py")),
        ("s*/**", GlobPlan("", None, None, "s*/**")),
        ("**", GlobPlan("", "*", None, None)),
    ],
)
def test_plan_glob(pattern: str, plan: GlobPlan) -> None:
    assert plan_glob(pattern) == plan


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("**/*.py", ["tests/test_app.py", "src/util/helpers.py", "src/app.py"]),
        ("*.py", ["tests/test_app.py", "src/util/helpers.py", "src/app.py"]),
        ("src/*.py", ["src/app.py"]),
        ("src/**/*.py", ["src/util/helpers.py", "src/app.py"]),
        ("**/tests/*.py", ["tests/test_app.py"]),
        ("*.log", []),
        ("build/*.py", ["build/gen.py"]),  # named explicitly, like `path`
        ("**/gen.py", []),
        ("**/*.yml", [".github/workflows/ci.yml"]),
        ("**/config", []),
        ("s*/**", ["src/web/page.ts", "src/util/helpers.py", "src/app.py"]),
        ("src/*/*.log", []),  # --glob would list it; the ignore-aware listing drops it
    ],
)
async def test_glob_newest_first_and_gitignore(
    repo: Path, ctx: ToolContext, pattern: str, expected: list[str]
) -> None:
    out = await run_tool(GLOB, {"pattern": pattern}, ctx)
    assert out.stage == "ok"
    found = [] if out.text == "No files found." else out.text.splitlines()
    assert found == [str(repo / e) for e in expected]


async def test_glob_with_path_and_absolute_pattern(repo: Path, ctx: ToolContext) -> None:
    out = await run_tool(GLOB, {"pattern": "*.py", "path": str(repo / "src")}, ctx)
    assert out.text.splitlines() == [str(repo / "src/util/helpers.py"), str(repo / "src/app.py")]
    out = await run_tool(GLOB, {"pattern": f"{repo}/tests/*.py"}, ctx)
    assert out.text.splitlines() == [str(repo / "tests/test_app.py")]


async def test_glob_caps_results_with_a_note(ws: Path, ctx: ToolContext) -> None:
    _tree(ws, {f"f{i:03d}.txt": "" for i in range(MAX_GLOB_RESULTS + 20)})
    out = await run_tool(GLOB, {"pattern": "*.txt"}, ctx)
    lines = out.text.splitlines()
    assert lines[0] == str(ws / f"f{MAX_GLOB_RESULTS + 19:03d}.txt")  # newest first
    assert len([line for line in lines if line.startswith("/")]) == MAX_GLOB_RESULTS
    assert f"of {MAX_GLOB_RESULTS + 20} matching files" in out.text


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"pattern": "*.py", "path": "src"}, "must be an absolute path"),
        ({"pattern": "*.py", "path": "/"}, "outside the workspace"),
        ({"pattern": "../*.py"}, "outside the workspace"),
        ({"pattern": "/etc/*.conf"}, "outside the workspace"),
    ],
)
async def test_glob_refusals(
    repo: Path, ctx: ToolContext, raw: dict[str, Any], expected: str
) -> None:
    out = await run_tool(GLOB, raw, ctx)
    assert out.stage == "refused" and expected in out.text


# --- Grep -------------------------------------------------------------------------------------


async def test_grep_files_with_matches_newest_first_honouring_gitignore(
    repo: Path, ctx: ToolContext
) -> None:
    out = await run_tool(GREP, {"pattern": "TODO"}, ctx)
    assert out.stage == "ok"
    assert out.text.splitlines() == [
        "Found 5 files",
        str(repo / "README.md"),
        str(repo / ".github/workflows/ci.yml"),
        str(repo / "tests/test_app.py"),
        str(repo / "src/web/page.ts"),
        str(repo / "src/util/helpers.py"),
    ]


async def test_grep_content_mode(repo: Path, ctx: ToolContext) -> None:
    raw = {"pattern": "todo", "-i": True, "output_mode": "content", "glob": "*.py"}
    out = await run_tool(GREP, raw, ctx)
    assert out.text.splitlines() == [
        f"{repo}/src/util/helpers.py:2:    return 'TODO'",
        f"{repo}/tests/test_app.py:2:# TODO write tests",
    ]
    context = {"pattern": "getcwd", "output_mode": "content", "-B": 1, "path": str(repo / "src")}
    out = await run_tool(GREP, context, ctx)
    assert out.text.splitlines() == [
        f"{repo}/src/app.py-3-def main():",
        f"{repo}/src/app.py:4:    return os.getcwd()",
    ]
    no_numbers = {"pattern": "getcwd", "output_mode": "content", "-n": False, "type": "py"}
    out = await run_tool(GREP, no_numbers, ctx)
    assert out.text == f"{repo}/src/app.py:    return os.getcwd()"


async def test_grep_count_mode(repo: Path, ctx: ToolContext) -> None:
    out = await run_tool(GREP, {"pattern": "return|import", "output_mode": "count"}, ctx)
    assert out.text.splitlines() == [
        f"{repo}/src/app.py:2",
        f"{repo}/src/util/helpers.py:1",
        f"{repo}/tests/test_app.py:1",
        "",
        "Found 4 matching lines in 3 files.",
    ]


async def test_grep_bad_regex_returns_ripgreps_message(repo: Path, ctx: ToolContext) -> None:
    out = await run_tool(GREP, {"pattern": "foo(", "output_mode": "content"}, ctx)
    assert out.stage == "error"
    assert "regex parse error" in out.text and "unclosed group" in out.text
    assert "escape" in out.text


async def test_grep_multiline_and_no_match(repo: Path, ctx: ToolContext) -> None:
    raw = {"pattern": r"main\(\):\s+return", "multiline": True, "output_mode": "files_with_matches"}
    out = await run_tool(GREP, raw, ctx)
    assert out.text.splitlines()[1:] == [str(repo / "src/app.py")]
    out = await run_tool(GREP, {"pattern": "nothing-like-this"}, ctx)
    assert out.stage == "ok" and out.text == "No matches found."


async def test_grep_pattern_starting_with_dash(repo: Path, ctx: ToolContext) -> None:
    (repo / "flags.txt").write_text("use --force here\n")
    out = await run_tool(GREP, {"pattern": "--force", "output_mode": "content"}, ctx)
    assert out.text == f"{repo}/flags.txt:1:use --force here"


async def test_grep_head_limit_and_hard_cap(ws: Path, ctx: ToolContext) -> None:
    (ws / "many.txt").write_text("hit\n" * (MAX_GREP_LINES + 50))
    out = await run_tool(GREP, {"pattern": "hit", "output_mode": "content", "head_limit": 3}, ctx)
    assert out.text.splitlines()[:3] == [f"{ws}/many.txt:{n}:hit" for n in (1, 2, 3)]
    assert f"Showing the first 3 of {MAX_GREP_LINES + 50} lines (head_limit=3)" in out.text
    out = await run_tool(GREP, {"pattern": "hit", "output_mode": "content"}, ctx)
    assert len([line for line in out.text.splitlines() if line.endswith(":hit")]) == MAX_GREP_LINES
    assert "the output was capped" in out.text


def test_grep_schema_uses_the_flag_aliases() -> None:
    properties = GREP.input_schema()["properties"]
    assert {"-i", "-n", "-A", "-B", "-C"} <= set(properties)
    assert "case_insensitive" not in properties


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"pattern": "x", "path": "src"}, "must be an absolute path"),
        ({"pattern": "x", "path": "/etc"}, "outside the workspace"),
        ({"pattern": "x", "glob": "../*.py"}, "must not contain '..'"),
    ],
)
async def test_grep_refusals(
    repo: Path, ctx: ToolContext, raw: dict[str, Any], expected: str
) -> None:
    out = await run_tool(GREP, raw, ctx)
    assert out.stage == "refused" and expected in out.text


# --- LS ---------------------------------------------------------------------------------------


async def test_ls_tree_skips_hidden_and_junk(repo: Path, ctx: ToolContext) -> None:
    _tree(repo, {"node_modules/pkg/index.js": "", "src/__pycache__/app.pyc": ""})
    out = await run_tool(LS, {"path": str(repo), "ignore": ["*.log", "nothing/"]}, ctx)
    assert out.stage == "ok"
    tree, footer = out.text.split("\n\n", 1)
    assert tree.splitlines() == [
        f"- {repo}/",
        "  - .gitignore",
        "  - README.md",
        "  - build/",
        "    - gen.py",
        "  - secret.py",
        "  - src/",
        "    - app.py",
        "    - util/",
        "      - helpers.py",
        "    - web/",
        "      - page.ts",
        "  - tests/",
        "    - test_app.py",
    ]
    assert ".git, .github, __pycache__, node_modules" in footer


async def test_ls_ignore_patterns_match_names_and_relative_paths(
    repo: Path, ctx: ToolContext
) -> None:
    out = await run_tool(LS, {"path": str(repo), "ignore": ["build/", "src/util", "*.md"]}, ctx)
    listed = out.text.split("\n\n", 1)[0]
    assert "build" not in listed and "helpers.py" not in listed and "README" not in listed
    assert "    - web/" in listed


async def test_grep_a_single_file(repo: Path, ctx: ToolContext) -> None:
    raw = {"pattern": "TODO", "path": str(repo / "README.md"), "output_mode": "count"}
    out = await run_tool(GREP, raw, ctx)
    assert out.text.splitlines()[0] == f"{repo}/README.md:1"


async def test_ls_truncates_breadth_first(ws: Path, ctx: ToolContext) -> None:
    _tree(ws, {f"d{i // 100}/f{i}.txt": "" for i in range(MAX_LS_ENTRIES + 100)})
    out = await run_tool(LS, {"path": str(ws)}, ctx)
    assert f"more than {MAX_LS_ENTRIES} entries" in out.text
    lines = [line for line in out.text.splitlines() if line.startswith("  ")]
    assert len(lines) == MAX_LS_ENTRIES
    assert sum(1 for line in lines if line.endswith("/")) == 11  # every top-level dir shown


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("src", "must be an absolute path"),
        ("{ws}/README.md", "is a file"),
        ("{ws}/nope", "does not exist"),
        ("{ws}/..", "outside the workspace"),
    ],
)
async def test_ls_refusals(repo: Path, ctx: ToolContext, path: str, expected: str) -> None:
    out = await run_tool(LS, {"path": path.format(ws=repo)}, ctx)
    assert out.stage == "refused" and expected in out.text


async def test_grep_content_is_in_path_order_with_hunks_kept(ws: Path, ctx: ToolContext) -> None:
    """ripgrep searches in parallel (no --sort); Warren puts whole files in path order and
    keeps the `--` between context hunks, within a file and between files."""
    for name in ("b.txt", "a.txt", "c.txt"):
        (ws / name).write_text("hit\nx\nx\nx\nx\nhit\n")
    raw = {"pattern": "hit", "output_mode": "content", "-A": 1, "path": str(ws)}
    out = await run_tool(GREP, raw, ctx)
    block = ["{p}:1:hit", "{p}-2-x", "--", "{p}:6:hit"]
    expected: list[str] = []
    for name in ("a.txt", "b.txt", "c.txt"):
        if expected:
            expected.append("--")
        expected += [line.format(p=ws / name) for line in block]
    assert out.text.splitlines() == expected
