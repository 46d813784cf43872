"""`omru down`: stop the cluster the context names (the one `omru up` started) and remove the context.

SIGTERM to the `omru up` process (it stops everything it started), a wait
for it to exit (--timeout), then SIGKILL to its process group (its children
die with it). Exit 3 when the context names no running cluster (none, or
one already gone: the stale context is removed).
"""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    p = subparsers.add_parser("down", help="stop the cluster `omru up` started (the context's)", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds to wait for it to stop after SIGTERM before SIGKILL (default 60)")
    p.set_defaults(func=handle)


def _wait_gone(ctx, timeout: float) -> bool:
    import time

    from omru import context

    deadline = time.monotonic() + timeout
    while context.alive(ctx):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def handle(args) -> int:
    import os
    import signal

    from omru import context
    from omru.cli.errors import CliError, Unreachable

    if not 0 < args.timeout <= 3600:
        raise CliError(f"--timeout {args.timeout} is not in (0, 3600]")
    where = context.path()
    try:
        ctx = context.load(where)
    except context.ContextError as exc:
        raise CliError(f"{exc} (remove it by hand)") from None
    if ctx is None:
        raise Unreachable(f"no cluster to stop: no context at {where} (`omru up` writes it; $OMRU_CONTEXT moves it)")
    if ctx.pid <= 0:  # written by hand for a cluster omru up did not start: not ours to stop or remove
        raise Unreachable(f"the context {where} names no `omru up` process: nothing here to stop (context kept)")
    if not context.alive(ctx):
        context.remove_if_own(ctx.started, where)
        raise Unreachable(f"the cluster of {where} is not running (omru up pid {ctx.pid} is gone); context removed")
    try:
        os.kill(ctx.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    except PermissionError:
        raise Unreachable(f"cannot signal omru up pid {ctx.pid} (another user's?); context {where} kept") from None
    killed = False
    if not _wait_gone(ctx, args.timeout):
        killed = True
        for kill in (lambda: os.killpg(ctx.pid, signal.SIGKILL), lambda: os.kill(ctx.pid, signal.SIGKILL)):
            try:
                kill()
            except (ProcessLookupError, PermissionError):
                pass
        _wait_gone(ctx, 10)
    context.remove_if_own(ctx.started, where)
    how = f"killed after {args.timeout:g} s" if killed else "stopped"
    print(f"{how} the cluster of omru up pid {ctx.pid} (planner {ctx.planner}); removed {where}")
    return 0
