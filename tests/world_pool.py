"""Worlds that mostly wait, run side by side: each test keeps its own world and its own checks.

A world of the udp backend under injected faults spends most of its wall time waiting out
retransmission timers and emulated queues, not computing (tests/test_udp_backend.py: 77 s of
wall for 30 s of CPU, one world at a time). A test marked with ``@pooled(world)`` has its world,
``world(**its parameters)``, started in the background as soon as the first pooled test of its
module runs, ``AT_ONCE`` at a time, in collection order; the test then blocks on that world's
result (``pooled_result()``, a fixture) and checks it as before. A world's failure is raised in
its own test's call, so every test fails alone, by its own name.

Only the items the session selected (``-k``, ``-m``) start worlds. Pooled tests should come
before the tests of their module that time something: those then run after every pooled world
has been waited for (items run in file order, each waiting for its own world).

A world that several tests share through a module fixture can start early too:
``module_worlds`` starts each one that a selected test of the module uses, by fixture name, as
the module's first test runs, and the fixture waits for its own (tests/test_abort.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import pytest

# Worlds of one module in flight at once. Four 2-rank worlds keep a core busy where one kept
# about 40 % of it; more would only queue their ranks behind each other on the 2-core CI host.
AT_ONCE = 4

F = TypeVar("F", bound=Callable[..., Any])


def pooled(world: Callable[..., Any]) -> Callable[[F], F]:
    """Marks a test whose world is ``world(**params)``, ``params`` its parametrize arguments."""

    def mark(test: F) -> F:
        test.pooled_world = world  # type: ignore[attr-defined]
        return test

    return mark


class WorldPool:
    """The pooled worlds of one module, started at construction, by item node id."""

    def __init__(self, items: list[pytest.Item], module: object) -> None:
        self._executor = ThreadPoolExecutor(max_workers=AT_ONCE, thread_name_prefix="world")
        self._futures: dict[str, Future[Any]] = {}
        for item in items:
            world = _world_of(item, module)
            if world is not None:
                self._futures[item.nodeid] = self._executor.submit(world)

    def result(self, item: pytest.Item, module: object) -> Any:
        future = self._futures.get(item.nodeid)
        if future is None:  # not in the session's list (should not happen): run it here
            world = _world_of(item, module)
            assert world is not None, f"{item.nodeid} is not a pooled test"
            return world()
        return future.result()

    def close(self) -> None:
        # Worlds of tests that never ran (-x stopped the session) are not started.
        self._executor.shutdown(wait=True, cancel_futures=True)


def _world_of(item: pytest.Item, module: object) -> Callable[[], Any] | None:
    if getattr(item, "module", None) is not module:
        return None
    world = getattr(getattr(item, "function", None), "pooled_world", None)
    if world is None:
        return None
    spec = getattr(item, "callspec", None)
    params = dict(spec.params) if spec is not None else {}
    return lambda: world(**params)


def module_worlds(
    request: pytest.FixtureRequest, worlds: dict[str, Callable[[], Any]]
) -> Iterator[dict[str, Future[Any]]]:
    """For a module-scoped autouse fixture (``yield from``): starts ``worlds[name]()`` in the
    background, side by side, for each fixture ``name`` that a test of the module the session
    selected uses; yields their futures by name, and waits for them at the module's end."""
    wanted = {
        name
        for item in request.session.items
        if getattr(item, "module", None) is request.module
        for name in getattr(item, "fixturenames", ())
        if name in worlds
    }
    if not wanted:
        yield {}
        return
    with ThreadPoolExecutor(max_workers=len(wanted), thread_name_prefix="module-world") as pool:
        yield {name: pool.submit(worlds[name]) for name in worlds if name in wanted}


@pytest.fixture(scope="module")
def world_pool(request: pytest.FixtureRequest) -> Iterator[WorldPool]:
    pool = WorldPool(request.session.items, request.module)
    yield pool
    pool.close()


@pytest.fixture
def pooled_result(
    world_pool: WorldPool, request: pytest.FixtureRequest
) -> Callable[[], Any]:
    """Call it in the test's body for its world's result (or the world's exception)."""
    return lambda: world_pool.result(request.node, request.module)
