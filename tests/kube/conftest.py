"""Fixtures for the Kubernetes tests (see tests/kube/helpers.py): `cluster` (the stand-in with
deploy/base installed), `empty_cluster` (nothing installed), `metrics_page` (an engine's /metrics
with a settable queue, and a ready Pod pointing at it). The least-privilege check runs last."""

from __future__ import annotations

import pytest

from tests.kube.helpers import Cluster, MetricsPage


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def empty_cluster(tmp_path):
    """The stand-in with nothing installed (kubectl installs deploy/base itself)."""
    c = Cluster(tmp_path, install=False)
    try:
        yield c
    finally:
        c.close()


def pytest_collection_modifyitems(items):
    """The least-privilege check reads the whole session's audit log: it runs last."""
    last = [i for i in items if i.get_closest_marker("audit_last")]
    for item in last:
        items.remove(item)
        items.append(item)


def pytest_configure(config):
    config.addinivalue_line("markers", "audit_last: runs after every other test (reads the session's audit)")


@pytest.fixture
def metrics_page():
    pages = []

    def make(waiting: float = 0.0) -> MetricsPage:
        pages.append(MetricsPage(waiting))
        return pages[-1]

    yield make
    for p in pages:
        p.close()
