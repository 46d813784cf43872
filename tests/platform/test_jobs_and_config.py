"""Jobs in the registry (idempotent put, validated transitions, CAS) and validated service configs."""

from __future__ import annotations

import grpc
import pytest

from omru.v1 import common_pb2, registry_pb2
from platform_helpers import job_spec, rpc_error
from services.common import config as cfg
from services.registry.jobstates import ALLOWED, TERMINAL, can_move

S = common_pb2


async def test_putting_the_same_job_twice_is_a_no_op(registry_stub):
    first = await registry_stub.PutJob(registry_pb2.PutJobRequest(spec=job_spec("j")))
    again = await registry_stub.PutJob(registry_pb2.PutJobRequest(spec=job_spec("j")))
    assert first.created and not again.created
    assert again.job.revision == first.job.revision
    assert again.job.state == S.JOB_STATE_PENDING


async def test_job_state_moves_by_compare_and_swap_and_a_stale_revision_is_aborted(registry_stub):
    job = (await registry_stub.PutJob(registry_pb2.PutJobRequest(spec=job_spec("j")))).job
    waiting = (await registry_stub.UpdateJobState(registry_pb2.UpdateJobStateRequest(
        job_id="j", state=S.JOB_STATE_WAITING, expected_revision=job.revision))).job
    assert waiting.state == S.JOB_STATE_WAITING and waiting.revision > job.revision
    stale = await rpc_error(registry_stub.UpdateJobState(registry_pb2.UpdateJobStateRequest(
        job_id="j", state=S.JOB_STATE_STARTING, expected_revision=job.revision)))
    assert stale.code() == grpc.StatusCode.ABORTED
    running = (await registry_stub.UpdateJobState(registry_pb2.UpdateJobStateRequest(
        job_id="j", state=S.JOB_STATE_STARTING, expected_revision=waiting.revision))).job
    progress = (await registry_stub.UpdateJobState(registry_pb2.UpdateJobStateRequest(
        job_id="j", state=S.JOB_STATE_STARTING, epochs_done=1, world_size=2, accuracy=0.5))).job
    assert (progress.epochs_done, progress.world_size, progress.accuracy) == (1, 2, 0.5)
    assert progress.revision > running.revision
    stored = (await registry_stub.GetJob(registry_pb2.GetJobRequest(job_id="j"))).job
    assert stored == progress


@pytest.mark.parametrize("state", sorted(ALLOWED))
def test_terminal_states_allow_nothing_and_every_other_state_can_fail_or_be_cancelled(state):
    if state in TERMINAL:
        assert not any(can_move(state, other) for other in ALLOWED)
    else:
        assert can_move(state, "FAILED") and can_move(state, "CANCELLED") and can_move(state, state)
        assert not can_move(state, "PENDING") or state in ("PENDING", "PROFILING")


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
