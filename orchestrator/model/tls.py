"""The TLS context of the SDK's HTTP client, made once by the warm server for the sessions it
forks.

Making it reads the CA bundle (40-70 ms of CPU, holding the GIL), which a session would
otherwise pay on its way to the first model request. The server calls `preload` before it
serves, in its own environment (which keeps the user's `SSL_CERT_FILE` and `SSL_CERT_DIR`:
`orchestrator.cli.client.server_env`); a forked session's `AnthropicModel` takes the context
(`preloaded`) only when it is the one the SDK would make itself: the session's environment
names the same CA file and directory as the server's did (what the SDK reads:
`httpcore2.default_ssl_context`), and every file the context may have been loaded from is
unchanged since (path, inode, size, mtime). Otherwise the SDK makes its own, as it does
in-process. Each session has its own copy (fork): nothing it does to the context reaches
another.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping

__all__ = ["preload", "preloaded"]

_CA_ENV = ("SSL_CERT_FILE", "SSL_CERT_DIR")
"""What the SDK's default context reads from the environment."""

_FALLBACK_BUNDLES = (
    "/etc/ssl/cert.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/pki/tls/cert.pem",
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/ssl/ca-bundle.pem",
)
"""Where httpcore2 looks for a bundle when OpenSSL's compiled-in paths hold none."""

_Stamp = tuple[tuple[str, int, int, int] | None, ...]

_context: tuple[ssl.SSLContext, tuple[str, ...], _Stamp] | None = None


def _ca_env(environ: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(environ.get(name) or "" for name in _CA_ENV)


def _stamp(ca_env: tuple[str, ...]) -> _Stamp:
    """The identity of every file or directory the default context may load from."""

    def one(path: str) -> tuple[str, int, int, int] | None:
        try:
            info = os.stat(path)
        except OSError:
            return None
        return (path, info.st_ino, info.st_size, info.st_mtime_ns)

    paths = ssl.get_default_verify_paths()
    sources = (*ca_env, paths.openssl_cafile, paths.openssl_capath, *_FALLBACK_BUNDLES)
    return tuple(one(path) for path in sources if path)


def preload(environ: Mapping[str, str] = os.environ) -> None:
    """Make the SDK's default context now, as it would in `environ` (the server's own, before
    it serves). Never raises: sessions then make their own."""
    global _context
    _context = None
    ca_env = _ca_env(environ)
    try:
        import httpx2

        stamp = _stamp(ca_env)
        context = httpx2.create_ssl_context(verify=True, trust_env=True)
    except Exception:
        return
    if ca_env == _ca_env(os.environ):  # what `trust_env` read
        _context = (context, ca_env, stamp)


def preloaded(environ: Mapping[str, str] = os.environ) -> ssl.SSLContext | None:
    """The preloaded context when it is what the SDK would make in `environ` now; None
    otherwise (and in a process no server forked)."""
    if _context is None:
        return None
    context, ca_env, stamp = _context
    if _ca_env(environ) != ca_env or _stamp(ca_env) != stamp:
        return None
    return context
