"""Validated service configs (jobs are the planner's: tests/planner_service)."""

from __future__ import annotations

import pytest

from services.common import config as cfg


@pytest.mark.parametrize(
    "build,named",
    [
        (lambda: cfg.ServerConfig(port=70000), "port"),
        (lambda: cfg.ServerConfig(auth_token="has space"), "token"),
        (lambda: cfg.EtcdConfig(endpoint="nohost"), "etcd endpoint"),
        (lambda: cfg.EtcdConfig(prefix="omru"), "prefix"),
        (lambda: cfg.ExecutorConfig(node_id="bad id"), "node_id"),
        (lambda: cfg.ExecutorConfig(node_id="n", slots=0), "slots"),
        (lambda: cfg.ExecutorConfig(node_id="n", ttl_seconds=0), "ttl_seconds"),
        (lambda: cfg.PlannerConfig(registry="x"), "registry"),
        (lambda: cfg.TlsConfig("missing-cert.pem", "missing-key.pem"), "cert_file"),
    ],
)
def test_invalid_config_is_refused_naming_the_value(build, named):
    with pytest.raises(cfg.ConfigError, match=named):
        build()


def test_server_main_exits_2_with_one_line_on_a_bad_config():
    import subprocess
    import sys

    from services.common.cluster import REPO_ROOT

    result = subprocess.run(
        [sys.executable, "-m", "services.registry.server", "--port", "99999", "--etcd", "127.0.0.1:1"],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["registry: error: port 99999 is not in 0..65535"]
