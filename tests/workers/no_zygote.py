"""A zygote that cannot be made (as where the sandbox refuses nested user namespaces), for
tests/workers/test_zygote.py's fallback test."""

raise SystemExit("unshare(0x30020000): Operation not permitted")
