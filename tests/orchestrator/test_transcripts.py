"""The session store: torn last lines repaired on open, ids never paths, typed write errors."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.errors import SessionError, TranscriptWriteError
from orchestrator.messages import Message
from orchestrator.records.transcripts import SessionStore, Transcript, parse_session_id


def records(path: Path) -> list[dict[str, object]]:
    """Every line of the transcript, each of which must be a whole JSON record."""
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n")
    return [json.loads(line) for line in data.decode("utf-8").splitlines()]


def new_session(store: SessionStore) -> str:
    transcript = store.create(cwd=Path("/repo"), model="m")
    transcript.message(Message.user_text("first"))
    transcript.message(Message.user_text("second"))
    transcript.close()
    return transcript.session_id


@pytest.mark.parametrize(
    "torn",
    [
        b'{"type":"message","message":{"role":"user","con',
        '{"type":"message","message":{"role":"user","content":"caf\u00e9'.encode()[:-1],
        b'{"type":"message","message":{"role":"user","content":"' + b"x" * 200_000,
        b"{",
    ],
    ids=["cut-json", "cut-inside-a-utf8-character", "longer-than-a-read-chunk", "one-byte"],
)
def test_a_torn_last_line_is_cut_off_on_open_and_resume_works(tmp_path: Path, torn: bytes) -> None:
    store = SessionStore(tmp_path / "sessions")
    session_id = new_session(store)
    path = store.path_for(session_id)
    whole = path.read_bytes()
    with path.open("ab") as f:
        f.write(torn)
    assert store.load(session_id).skipped_lines == 1  # loads even torn

    transcript = store.open(session_id)
    transcript.message(Message.user_text("third"))
    transcript.close()

    assert path.read_bytes().startswith(whole)
    lines = records(path)  # every line whole again
    assert lines[-2] == {"type": "repair", "dropped_torn_bytes": len(torn), "ts": lines[-2]["ts"]}
    texts = [r["message"]["content"][0]["text"] for r in lines if r["type"] == "message"]  # type: ignore[index]
    assert texts == ["first", "second", "third"]
    loaded = store.load(session_id)
    assert loaded.skipped_lines == 0
    assert loaded.messages[-1].text().endswith("third")


def test_a_transcript_that_is_all_torn_is_emptied(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    session_id = str(uuid.uuid4())
    store.path_for(session_id).write_bytes(b'{"type":"sess')
    store.open(session_id).close()
    assert [r["type"] for r in records(store.path_for(session_id))] == ["repair"]


def test_a_whole_transcript_is_left_byte_identical(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    session_id = new_session(store)
    before = store.path_for(session_id).read_bytes()
    store.open(session_id).close()
    assert store.path_for(session_id).read_bytes() == before


# --- session ids ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "../../etc/passwd",
        "/etc/passwd",
        "..",
        ".",
        "",
        "a/b",
        "0b8f6c1e-5d7a-4e8b-9c1d-2f3a4b5c6d7e.jsonl",
        "0b8f6c1e-5d7a-4e8b-9c1d-2f3a4b5c6d7e/../x",
        "0B8F6C1E-5D7A-4E8B-9C1D-2F3A4B5C6D7E",
        "0b8f6c1e-5d7a-4e8b-9c1d-2f3a4b5c6d7e\n",
        "latest",
        "agent-123",
        "~/.ssh/id_rsa",
        "x" * 5000,
    ],
)
def test_a_resume_value_must_be_a_session_id_never_a_path(tmp_path: Path, value: str) -> None:
    store = SessionStore(tmp_path / "sessions")
    outside = tmp_path / "victim.jsonl"
    outside.write_text('{"type":"session"}\n')
    for attempt in (store.load, store.open, store.path_for, parse_session_id):
        with pytest.raises(SessionError) as caught:
            attempt(value)
        message = str(caught.value)
        assert "\n" not in message and len(message) < 300
        assert "session id" in message or "path" in message
    assert not (tmp_path / "sessions").exists()  # nothing was created for a bad id
    assert outside.read_text() == '{"type":"session"}\n'


def test_the_ids_the_store_makes_are_accepted(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    session_id = new_session(store)
    assert parse_session_id(session_id) == session_id
    assert parse_session_id("agent-0123456789ab") == "agent-0123456789ab"
    assert store.latest_for(Path("/repo")) == session_id


def test_continue_ignores_files_that_are_not_store_transcripts(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    (tmp_path / "notes.jsonl").write_text('{"type":"session","cwd":"/repo"}\n')
    assert store.latest_for(Path("/repo")) is None


# --- write failures ---------------------------------------------------------------------------


def test_a_failed_append_is_a_typed_error(tmp_path: Path) -> None:
    """/dev/full fails every write with ENOSPC, for any user."""
    transcript = Transcript(tmp_path / "t.jsonl", "s", open("/dev/full", "a", encoding="utf-8"))  # noqa: SIM115
    with pytest.raises(TranscriptWriteError, match="No space left on device") as caught:
        transcript.write({"type": "message"})
    transcript.close()
    assert caught.value.path == tmp_path / "t.jsonl"
    assert isinstance(caught.value.__cause__, OSError)


def test_an_unwritable_store_is_a_typed_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    store = SessionStore(tmp_path / "file" / "sessions")  # its parent is a file
    with pytest.raises(TranscriptWriteError, match="Cannot open the session transcript"):
        store.create(cwd=Path("/repo"), model="m")


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root; /dev/full covers the error for other users")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_mid_record_leaves_whole_records_and_resume_works(small_tmpfs: Path) -> None:
    store = SessionStore(small_tmpfs / "sessions")
    session_id = new_session(store)
    path = store.path_for(session_id)
    before = path.read_bytes()
    transcript = store.open(session_id)
    with pytest.raises(TranscriptWriteError, match="No space left on device"):
        transcript.message(Message.user_text("y" * 200_000))  # larger than the disk
    transcript.close()
    assert path.read_bytes() == before  # the part that fitted was cut back off
    loaded = store.load(session_id)
    assert loaded.skipped_lines == 0 and loaded.messages[-1].text().endswith("second")


@pytest.mark.parametrize("left", [b"", b'{"session_id": "x", "first_pro'])
def test_a_summary_a_crash_left_empty_or_cut_is_read_from_the_transcript(
    tmp_path: Path, left: bytes
) -> None:
    """The summary is written without fsync (it is on the first request's path): what a
    crash leaves of it is never believed; `warren sessions` reads the transcript's head."""
    store = SessionStore(tmp_path)
    transcript = store.create(cwd=Path("/repo"), model="m")
    transcript.message(Message.user_text("fix the tests"))
    transcript.note_prompt("fix the tests")
    transcript.close()
    meta = transcript.path.with_suffix(".meta.json")
    assert json.loads(meta.read_bytes())["first_prompt"] == "fix the tests"
    meta.write_bytes(left)
    (summary,) = store.summaries()
    assert (summary.session_id, summary.cwd, summary.model) == (transcript.session_id, "/repo", "m")
    assert summary.first_prompt == "fix the tests"
