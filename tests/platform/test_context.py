"""The context file (omru.context) and the command line's errors: precedence flag > env > context >
default, the file's mode and ownership, exit 3 for an unreachable service, --version."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from omru import context
from omru.cli.main import main

ENVS = ("OMRU_CONTEXT", "OMRU_PLANNER", "OMRU_REGISTRY", "OMRU_PROFILER", "OMRU_AUTH_TOKEN",
        "OMRU_TLS_CA", "OMRU_TLS_CERT", "OMRU_TLS_KEY")


@pytest.fixture(autouse=True)
def clean_env(tmp_path, monkeypatch):
    """No address, token or context from the machine: the context lives under tmp_path/cfg."""
    for name in ENVS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "cfg" / "omru" / "context.json"


def _ctx(**kw) -> context.Context:
    base = dict(planner="10.0.0.1:1000", registry="10.0.0.1:1001", profiler="10.0.0.1:1002", etcd="10.0.0.1:2379",
                executors=["10.0.0.1:1003"], metrics={"planner": "10.0.0.1:9000"}, token="ctx-token",
                tls_ca="/ctx/ca.pem", pid=os.getpid(), started=context.process_identity(os.getpid()))
    base.update(kw)
    return context.Context(**base)


def test_the_path_follows_omru_context_then_xdg_then_home(clean_env, tmp_path, monkeypatch):
    assert context.path() == clean_env
    monkeypatch.delenv("XDG_CONFIG_HOME")
    assert context.path() == tmp_path / "home" / ".config" / "omru" / "context.json"
    monkeypatch.setenv("OMRU_CONTEXT", str(tmp_path / "elsewhere.json"))
    assert context.path() == tmp_path / "elsewhere.json"


def test_written_atomically_private_and_read_back_ignoring_unknown_keys(clean_env):
    written = context.write(_ctx())
    assert written == clean_env
    assert stat.S_IMODE(clean_env.stat().st_mode) == 0o600
    assert stat.S_IMODE(clean_env.parent.stat().st_mode) == 0o700
    assert [p.name for p in clean_env.parent.iterdir()] == ["context.json"]  # no temp file left
    data = json.loads(clean_env.read_text())
    assert data["version"] == 1 and data["metrics"] == {"planner": "10.0.0.1:9000"}
    data["from_the_future"] = {"x": 1}
    clean_env.write_text(json.dumps(data))
    assert context.load() == _ctx()
    clean_env.write_text("{not json")
    with pytest.raises(context.ContextError, match="not JSON"):
        context.load()


def test_removed_only_by_the_process_it_names(clean_env):
    context.write(_ctx(started="1:999"))
    assert not context.remove_if_own(context.process_identity(os.getpid()))
    assert clean_env.exists()
    assert context.remove_if_own("1:999") and not clean_env.exists()
    assert not context.remove_if_own("1:999")


def test_alive_tells_the_owner_from_a_reused_pid():
    assert context.alive(_ctx())
    assert not context.alive(_ctx(started=f"{os.getpid()}:1"))  # same pid, another start time
    assert not context.alive(_ctx(pid=0))


def test_precedence_is_flag_then_env_then_context_then_default(clean_env, monkeypatch):
    assert context.resolve("planner", default="127.0.0.1:50051").address == "127.0.0.1:50051"
    assert context.resolve("registry").address is None
    context.write(_ctx())
    c = context.resolve("planner", default="127.0.0.1:50051")
    assert (c.address, c.source, c.token, c.tls_ca) == ("10.0.0.1:1000", "context", "ctx-token", "/ctx/ca.pem")
    assert context.resolve("profiler").address == "10.0.0.1:1002"
    monkeypatch.setenv("OMRU_PLANNER", "10.0.0.2:2000")
    monkeypatch.setenv("OMRU_AUTH_TOKEN", "env-token")
    c = context.resolve("planner", default="127.0.0.1:50051")
    # not the context's address: its TLS files are not used for it
    assert (c.address, c.source, c.token, c.tls_ca) == ("10.0.0.2:2000", "env", "env-token", None)
    c = context.resolve("planner", "10.0.0.3:3000", "flag-token", default="127.0.0.1:50051")
    assert (c.address, c.source, c.token) == ("10.0.0.3:3000", "flag", "flag-token")
    monkeypatch.delenv("OMRU_AUTH_TOKEN")
    assert context.resolve("planner", "10.0.0.3:3000").token is None  # the context's token stays with its cluster
    assert context.resolve("planner", "10.0.0.1:1000").token == "ctx-token"


def test_the_sdk_finds_the_planner_of_the_context(clean_env, monkeypatch):
    from omru import errors
    from omru.client import Client, SyncClient, connect_options

    assert connect_options() == ("127.0.0.1:50051", None, None)
    context.write(_ctx(tls_ca=None))
    assert Client().address == "10.0.0.1:1000" and Client().token == "ctx-token"
    monkeypatch.setenv("OMRU_PLANNER", "10.0.0.2:2000")
    assert Client().address == "10.0.0.2:2000" and Client().token is None
    with SyncClient("10.0.0.4:4000") as c:
        assert c.address == "10.0.0.4:4000"
    clean_env.unlink()
    with pytest.raises(errors.Unavailable, match="no registry address"):
        connect_options(service="registry")


def test_an_unreachable_planner_exits_3_naming_it(free_port, capsys):
    address = f"127.0.0.1:{free_port()}"
    assert main(["status", "--planner", address]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"omru: cannot reach the planner at {address} (no cluster running? start one with "
                          "`omru up`, or set --planner / $OMRU_PLANNER)"), err
    for argv in (["submit", "examples/demo.yaml"], ["watch"], ["report"], ["cancel", "x"], ["logs", "x"]):
        assert main([*argv, "--planner", address]) == 3, argv
        assert f"cannot reach the planner at {address}" in capsys.readouterr().err, argv
    assert main(["logs", "x", "--registry", address]) == 3
    assert f"cannot reach the registry at {address}" in capsys.readouterr().err
    assert main(["nodes", "--registry", address]) == 3
    assert f"cannot reach the registry at {address}" in capsys.readouterr().err
    assert main(["status", "--planner", "nohostport"]) == 2  # usage stays 2
    assert "is not host:port" in capsys.readouterr().err


def test_a_stale_context_is_named_when_its_cluster_is_gone(clean_env, free_port, capsys):
    gone = f"127.0.0.1:{free_port()}"
    context.write(_ctx(planner=gone, registry=gone, profiler=gone, tls_ca=None, token=None))
    for argv, service in ((["status"], "planner"), (["nodes"], "registry"),
                          (["profile", "--model", "resnet18", "--dataset", "digits", "--gpus", "1"], "profiler")):
        assert main(argv) == 3, argv
        err = capsys.readouterr().err
        assert f"cannot reach the {service} at {gone}" in err and str(clean_env) in err, err


def test_with_no_cluster_known_down_nodes_and_profile_exit_3(clean_env, capsys):
    assert main(["down"]) == 3
    assert f"no cluster to stop: no context at {clean_env}" in capsys.readouterr().err
    assert main(["nodes"]) == 3
    assert "no registry address" in capsys.readouterr().err
    assert main(["profile", "--model", "resnet18", "--dataset", "digits"]) == 3
    assert "no profiler address" in capsys.readouterr().err
    context.write(_ctx(pid=0, started=""))  # written by hand for a remote cluster: kept
    assert main(["down"]) == 3
    assert "names no `omru up` process" in capsys.readouterr().err and clean_env.exists()
    context.write(_ctx(pid=2 ** 22 + 1, started="4194305:1"))  # a cluster that is gone
    assert main(["down"]) == 3
    assert "is not running" in capsys.readouterr().err and not clean_env.exists()


def test_a_broken_context_is_a_usage_error_naming_it(clean_env, capsys):
    clean_env.parent.mkdir(parents=True)
    clean_env.write_text("[]")
    assert main(["status"]) == 2
    assert str(clean_env) in capsys.readouterr().err


def test_version():
    from importlib import metadata

    import omru

    done = subprocess.run([sys.executable, "-m", "omru", "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    try:
        expected = metadata.version("omru")
    except metadata.PackageNotFoundError:
        expected = omru.__version__
    assert done.stdout.strip() == f"omru {expected}"


class _Rpc(Exception):
    def __init__(self, code, details):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


def test_an_unavailable_service_says_why_in_one_line():
    import grpc

    from omru.cli.errors import from_rpc

    U = grpc.StatusCode.UNAVAILABLE
    refused = "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:9: Connection refused"
    closed = "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:9: Socket closed"
    a = "127.0.0.1:9"
    assert str(from_rpc(_Rpc(U, refused), "planner", a)) == (
        f"cannot reach the planner at {a} (no cluster running? start one with `omru up`, or set --planner / $OMRU_PLANNER)")
    assert str(from_rpc(_Rpc(U, closed), "planner", a, tls=True)).endswith(
        "perhaps in the TLS handshake (check --tls-ca, --tls-cert, --tls-key or $OMRU_TLS_*) "
        "[UNAVAILABLE: ipv4:127.0.0.1:9: Socket closed]")
    assert "[UNAVAILABLE: ipv4:127.0.0.1:9: Socket closed]" in str(from_rpc(_Rpc(U, closed), "planner", a, tls=False))
    standby = "not the leader; the leader is planner-b at 10.0.0.2:50051"
    assert str(from_rpc(_Rpc(U, standby), "planner", a)).startswith(f"the planner at {a} is unavailable: {standby} (")
    assert "did not answer in time" in str(from_rpc(_Rpc(grpc.StatusCode.DEADLINE_EXCEEDED, ""), "registry", a))
    assert from_rpc(_Rpc(grpc.StatusCode.NOT_FOUND, "no job"), "planner", a) is None
