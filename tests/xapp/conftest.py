"""Fixtures of the xApp's process-level tests."""
import pytest


@pytest.fixture()
def redis_env(redis_server, monkeypatch):
    """A private real Redis, handed to the processes under test the way the platform does (DBAAS_*)."""
    monkeypatch.setenv("DBAAS_SERVICE_HOST", redis_server["host"])
    monkeypatch.setenv("DBAAS_SERVICE_PORT", str(redis_server["port"]))
    return redis_server
