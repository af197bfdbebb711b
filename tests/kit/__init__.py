"""Shared test fixtures that are real things, not mocks: the fake Messages API server (fake_api)."""
