"""Fixtures of the multi-host tests (marker `multihost`; `make test-multihost`).

    multihost    a started MultiHostCluster (cluster.py): head + host-a +
                 host-b as network namespaces; an error saying why where
                 namespaces cannot be made (not root, no iproute2): these
                 tests run only when asked for (`-m multihost`)
"""

from __future__ import annotations

import pytest

from tests.multihost import netns
from tests.multihost.cluster import MultiHostCluster


@pytest.fixture
def multihost(tmp_path):
    why = netns.unavailable()
    if why:
        pytest.fail(f"no network namespaces here: {why}", pytrace=False)
    cluster = MultiHostCluster(tmp_path).start()
    try:
        yield cluster
    finally:
        cluster.stop()
