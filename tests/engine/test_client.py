"""EngineClient is the one protocol AsyncLLM reaches an engine through: the
engine thread, a data-parallel replica process and the router over replicas
each implement every member of it, with the protocol's parameters."""
from __future__ import annotations

import inspect

import pytest

from armllm.engine.client import EngineClient
from armllm.engine.data_parallel import RemoteReplica, ReplicaRouter
from armllm.engine.engine_thread import EngineThread
from tests.engine.sim import SimEngine

MEMBERS = sorted(name for name in vars(EngineClient) if not name.startswith("_"))


def test_the_protocol_names_what_a_client_of_the_engine_uses():
    assert MEMBERS == ["abort", "add", "alive", "closed_by_shutdown", "failure", "shutdown",
                       "stats"]


@pytest.mark.parametrize("client", [EngineThread, RemoteReplica, ReplicaRouter])
def test_every_engine_client_has_every_member(client):
    for name in MEMBERS:
        want, have = getattr(EngineClient, name), getattr(client, name, None)
        assert have is not None, f"{client.__name__} has no {name}"
        if isinstance(want, property):
            assert isinstance(have, property), f"{client.__name__}.{name} is not a property"
        else:
            assert list(inspect.signature(have).parameters) == \
                list(inspect.signature(want).parameters), f"{client.__name__}.{name}"


def test_the_engine_thread_and_a_router_over_it_are_engine_clients():
    thread = EngineThread(SimEngine().engine)
    try:
        router = ReplicaRouter([thread], block_size=4)
        assert isinstance(thread, EngineClient) and isinstance(router, EngineClient)
        assert router.alive and router.failure is None and not router.closed_by_shutdown
    finally:
        thread.shutdown()
    assert router.closed_by_shutdown
