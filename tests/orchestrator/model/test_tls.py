"""The TLS context the warm server makes for its sessions (`orchestrator.model.tls`) is used
only where it is the one the SDK would make: the same CA settings, the same CA files."""

from __future__ import annotations

import shutil
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.model import tls
from orchestrator.model.anthropic import AnthropicModel


@pytest.fixture
def bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A CA file of our own named by `SSL_CERT_FILE`, preloaded; the module left clean."""
    source = ssl.get_default_verify_paths().cafile or "/etc/ssl/certs/ca-certificates.crt"
    if not Path(source).is_file():
        pytest.skip("no CA bundle on this machine")
    path = tmp_path / "ca.pem"
    shutil.copyfile(source, path)
    monkeypatch.setenv("SSL_CERT_FILE", str(path))
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    tls.preload()
    yield path
    monkeypatch.setattr(tls, "_context", None)


def test_a_session_with_the_servers_ca_settings_gets_the_preloaded_context(
    bundle: Path,
) -> None:
    context = tls.preloaded()
    assert context is not None
    assert tls.preloaded() is context
    client = AnthropicModel("claude-test", api_key="sk-test")._new_client()
    transport = client._client._transport  # the SDK's default client, on our context
    assert transport._pool._ssl_context is context  # type: ignore[attr-defined]


def test_other_ca_settings_or_a_changed_ca_file_get_none(
    bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert tls.preloaded({"SSL_CERT_FILE": "/elsewhere.pem"}) is None
    assert tls.preloaded({"SSL_CERT_FILE": str(bundle), "SSL_CERT_DIR": "/etc/ssl"}) is None
    assert tls.preloaded({}) is None
    with bundle.open("a") as f:
        f.write("\n")
    assert tls.preloaded() is None
    client = AnthropicModel("claude-test", api_key="sk-test")._new_client()
    assert client._client._transport._pool._ssl_context is not None  # type: ignore[attr-defined]


def test_a_process_no_server_forked_has_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tls, "_context", None)
    assert tls.preloaded() is None
