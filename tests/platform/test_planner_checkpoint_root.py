"""The planner's --checkpoint-root is checked when it starts: a folder whose
parent is missing, not a folder, relative or not writable stops the planner
process with one line naming it and exit code 2; a writable one (made when
only its last part is missing) lets it serve, and the check leaves nothing
behind."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from services.common.cluster import REPO_ROOT, child_env


def run_planner(root: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """The planner process with that checkpoint root (nothing listens at the addresses: the check comes first)."""
    argv = [*prefix, sys.executable, "-m", "services.planner.server", "--port", "0", "--etcd", "127.0.0.1:1",
            "--registry", "127.0.0.1:1", "--profiler", "127.0.0.1:1", "--checkpoint-root", root]
    return subprocess.run(argv, cwd=REPO_ROOT, env=child_env(), capture_output=True, text=True, timeout=60)


def read_only(folder) -> tuple[str, ...]:
    """A command prefix under which folder cannot be written to by this user: root writes through
    permission bits, so for root a private mount namespace makes it a read-only bind mount."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return ()
    return ("unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount --bind -o ro "$0" "$0" && exec "$@"', str(folder))


@pytest.mark.parametrize("case", ["missing", "a file", "relative", "read-only"])
def test_a_checkpoint_root_the_planner_cannot_write_stops_it_with_one_line_and_exit_2(tmp_path, case):
    prefix: tuple[str, ...] = ()
    if case == "missing":
        root, said = str(tmp_path / "not-mounted" / "checkpoints"), "does not exist"
    elif case == "a file":
        (tmp_path / "file").write_text("")
        root, said = str(tmp_path / "file"), "is not a folder"
    elif case == "relative":
        root, said = "checkpoints", "is not an absolute path"
    else:
        (tmp_path / "ro").mkdir()
        root, said = str(tmp_path / "ro"), "is not writable by uid"
        prefix = read_only(tmp_path / "ro")
    done = run_planner(root, prefix)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stderr.strip().splitlines()[-1].startswith(f"planner: error: checkpoint root {root!r} {said}"), done.stderr
    assert done.stdout == ""  # never ready


async def test_a_writable_checkpoint_root_lets_the_planner_serve_and_the_check_leaves_nothing(etcd, start_service, tmp_path):
    root = tmp_path / "shared"  # its parent exists: the planner makes it (as `omru emulate` expects)
    planner = await start_service("planner", "--etcd", etcd.endpoint, "--registry", "127.0.0.1:1",
                                  "--profiler", "127.0.0.1:1", "--checkpoint-root", str(root))
    assert planner.info["service"] == "planner" and planner.proc.poll() is None
    assert list(root.iterdir()) == []
