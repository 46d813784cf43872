"""`omru status`, `omru watch` and `omru report` against a real cluster: real etcd, a real registry, an
in-process planner and an emulated executor (real ExecutorService, workers that sleep) on port 0.
The commands run in-process (main(argv)) on a thread, so the servers on this loop keep serving."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re

from omru.cli.main import main
from omru.v1 import planner_pb2
from services.common import config as cfg
from services.executor import server as executor_server
from services.executor.emulated import Emulation, EmulatedRuntime, emulated_gpus
from services.planner.core.model import Job
from tests.planner_service.planner_helpers import planner, spec

SPEED = 100.0  # job seconds per wall second
LOG = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[")  # the in-process servers' log lines (stdout)
STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d ")


@contextlib.asynccontextmanager
async def cluster(etcd, registry, tmp_path, jobs, slots: int = 2):
    """(planner address, dispatcher, stub) with one emulated node of `slots` GPUs running `jobs`."""
    async with planner(etcd.endpoint, registry.address, checkpoint_root=str(tmp_path / "ckpt"), policy="fifo",
                       time_scale=SPEED, start_overhead_s=0.0) as (running, d, stub):
        config = cfg.ExecutorConfig(node_id="node-0", server=cfg.ServerConfig(port=0), registry=registry.address,
                                    slots=slots, ttl_seconds=5, work_dir=tmp_path / "node-0",
                                    warm_workers=False, checkpoint_root=tmp_path)
        runtime = EmulatedRuntime(Emulation({j.id: j for j in jobs}, speed=SPEED), "node-0", slots)
        node, _ = await executor_server.start(config, runtime=runtime, node_gpus=emulated_gpus(slots))
        try:
            yield running.address, d, stub
        finally:
            await node.stop(0)


async def submit(stub, *jobs: Job) -> None:
    await stub.SubmitJobs(planner_pb2.SubmitJobsRequest(
        jobs=[spec(j.id, epochs=j.epochs, max_gpus=max(j.profile)) for j in jobs],
        profiles=[planner_pb2.JobProfile(job_id=j.id, epoch_seconds=dict(j.profile)) for j in jobs]), timeout=5)


async def until(d, check, timeout: float = 30.0) -> None:
    for _ in range(int(timeout / 0.05)):
        if check(d.records):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not reached in {timeout} s: {({j: r.state for j, r in d.records.items()})}")


async def omru(capsys, *argv: str) -> tuple[int, str, str]:
    """Run `omru argv` on a thread: (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = await asyncio.to_thread(main, list(argv))
    out, err = capsys.readouterr()
    return code, "".join(line for line in out.splitlines(True) if not LOG.match(line)), err


def running(job_id: str):
    return lambda records: job_id in records and records[job_id].state == "RUNNING" and records[job_id].epochs_done >= 2


def terminal(*job_ids: str):
    return lambda records: all(j in records and records[j].terminal for j in job_ids)


async def test_status_shows_where_each_job_stands_and_filters(etcd, registry, tmp_path, capsys):
    long, short = Job("long", 30, {1: 30.0}), Job("short", 2, {1: 30.0})
    async with cluster(etcd, registry, tmp_path, [long, short], slots=1) as (address, d, stub):
        code, out, err = await omru(capsys, "status", "--planner", address)
        assert (code, out.strip()) == (0, "no jobs")

        await submit(stub, long, short, Job("gone", 30, {1: 30.0}))
        await stub.CancelJob(planner_pb2.CancelJobRequest(job_id="gone"), timeout=5)
        await until(d, running("long"))
        code, out, err = await omru(capsys, "status", "--planner", address)
        assert code == 0, err
        lines = out.splitlines()
        assert re.match(r"plan v\d+ \(fifo\) made \d{4}-\d\d-\d\dT", lines[0]), lines[0]
        assert lines[1].split() == ["JOB", "OWNER", "STATE", "GPUS", "NODES", "EPOCHS", "SUBMITTED", "AGE", "ETA",
                                    "REASON"]
        # (its first column of each row, a job's id; the owner "-": this cluster checks no credentials)
        rows = {line.split()[0]: line.split()[:1] + line.split()[2:] for line in lines[2:]}
        assert all(line.split()[1] == "-" for line in lines[2:])
        assert rows["long"][1:4] == ["running", "1", "node-0"]
        done, total = map(int, rows["long"][4].split("/"))
        assert total == 30 and 2 <= done < 30
        assert STAMP.match(rows["long"][5] + " ") and re.fullmatch(r"\d+s|\d+m\d\ds", rows["long"][6])  # submitted, age
        assert re.fullmatch(r"\d+s|\d+m\d\ds", rows["long"][7]), rows["long"]  # ETA filled while it runs
        assert rows["gone"][1] == "cancelled" and "cancelled by a client" in " ".join(rows["gone"][8:])
        # short waits for long's GPU: when it came, since when, and why it waits
        assert rows["short"][1:5] == ["waiting", "-", "-", "0/2"] and STAMP.match(rows["short"][5] + " ")
        assert " ".join(rows["short"][8:]).startswith("planned to start in ")

        code, out, _ = await omru(capsys, "status", "--planner", address, "--state", "cancelled,finished")
        assert {line.split()[0] for line in out.splitlines()[2:]} <= {"gone", "short"}
        assert "long" not in out

        code, out, _ = await omru(capsys, "status", "--planner", address, "--json")
        doc = json.loads(out)
        by_id = {j["job_id"]: j for j in doc["jobs"]}
        assert by_id["long"]["nodes"] == ["node-0"] and by_id["long"]["eta_s"] > 0 and by_id["long"]["gpus"] == 1
        assert doc["plan"]["policy"] == "fifo"

        await until(d, terminal("long", "short"), 60)
        code, out, _ = await omru(capsys, "status", "--planner", address)
        assert code == 0 and "plan v" not in out  # idle: no stale plan line
        assert "finished" in out
        assert json.loads((await omru(capsys, "status", "--planner", address, "--json"))[1])["plan"] is None


async def test_bad_flag_values_exit_2_naming_them(etcd, registry, tmp_path, capsys):
    async with cluster(etcd, registry, tmp_path, []) as (address, d, stub):
        for argv, named in [(("status", "--state", "running,bogus"), "'bogus'"),
                            (("status", "-w", "--timeout", "-1"), "-1"),
                            (("watch", "--timeout", "0"), "0"),
                            (("watch", "nosuchjob"), "nosuchjob"),
                            (("report", "--batch", "two"), "'two'"),
                            (("report", "--batch", "3"), "3"),
                            (("report", "--since", "yesterday-ish"), "'yesterday-ish'")]:
            code, out, err = await omru(capsys, *argv, "--planner", address)
            assert code == 2, (argv, out, err)
            assert named in err and argv[0] in err, (argv, err)


async def test_status_watch_prints_a_timestamped_line_per_change(etcd, registry, tmp_path, capsys):
    job = Job("w", 8, {1: 30.0})
    async with cluster(etcd, registry, tmp_path, [job]) as (address, d, stub):
        task = asyncio.ensure_future(omru(capsys, "status", "-w", "--timeout", "6", "--planner", address))
        await asyncio.sleep(1.0)
        await submit(stub, job)
        code, out, err = await task
        assert code == 0, err
        code, js, err = await omru(capsys, "status", "-w", "--json", "--timeout", "1", "--planner", address)
    assert code == 0 and [json.loads(line)["state"] for line in js.splitlines()] == ["FINISHED"]
    lines = out.splitlines()
    assert lines and all(STAMP.match(line) for line in lines), lines
    epochs = [int(m[1]) for m in (re.search(r"epochs=(\d+)/8", line) for line in lines) if m]
    assert epochs == sorted(epochs) and epochs[-1] == 8 and len(set(epochs)) >= 4  # a line per epoch
    states = [line.split()[2] for line in lines]
    assert "running" in states and states[-1] == "finished"
    assert len(lines) == len({(line.split(" ", 1)[1].split(" age=")[0]) for line in lines})  # no repeats


async def test_watch_follows_the_jobs_named_and_exits_by_them_only(etcd, registry, tmp_path, capsys):
    ok, doomed = Job("ok", 6, {1: 30.0}), Job("doomed", 200, {1: 30.0})
    async with cluster(etcd, registry, tmp_path, [ok, doomed]) as (address, d, stub):
        await submit(stub, Job("old", 50, {1: 30.0}))
        await stub.CancelJob(planner_pb2.CancelJobRequest(job_id="old"), timeout=5)  # history: not watched
        await submit(stub, ok)
        code, out, err = await omru(capsys, "watch", "--planner", address)
        assert code == 0, err  # the cancelled job of before does not count
        lines = out.splitlines()
        assert all(STAMP.match(line) for line in lines) and not any(" old " in line for line in lines)
        assert re.search(r"ok +6/6 +epochs .* finished", lines[-1]), lines[-1]
        assert any(re.search(r"ETA +\d+s", line) for line in lines if "running" in line), lines

        code, out, err = await omru(capsys, "watch", "ok", "--planner", address)  # already done: exits now
        assert code == 0 and "6/6" in out

        await submit(stub, doomed)
        await until(d, running("doomed"))
        code, out, err = await omru(capsys, "watch", "doomed", "--timeout", "0.5", "--planner", address)
        assert code == 1 and "still going: doomed" in err and "running" in out
        task = asyncio.ensure_future(omru(capsys, "watch", "doomed", "--planner", address))
        await asyncio.sleep(1.0)
        await stub.CancelJob(planner_pb2.CancelJobRequest(job_id="doomed"), timeout=5)
        code, out, err = await task
        assert code == 1 and "cancelled" in out.splitlines()[-1]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


async def test_watch_and_status_w_redraw_live_on_a_terminal(etcd, registry, tmp_path):
    from omru.cli.commands import status, watch
    from omru.client import SyncClient

    job = Job("bar", 12, {1: 30.0})
    async with cluster(etcd, registry, tmp_path, [job]) as (address, d, stub):
        await submit(stub, job)
        bars, table = Terminal(), Terminal()

        def follow():
            with SyncClient(address) as c:
                return watch.follow(c, ["bar"], timeout_s=30, out=bars)

        def status_w():
            with SyncClient(address) as c:
                return status.watch(c, [], False, 2.5, out=table)

        latest, code = await asyncio.gather(asyncio.to_thread(follow), asyncio.to_thread(status_w))
    assert latest["bar"].state == "FINISHED" and code == 0
    text = bars.getvalue()
    assert "\x1b[" in text and "━" in text and "12/12" in text and "bar" in text  # rich's bar, redrawn in place
    text = table.getvalue()
    assert "\x1b[" in text and "JOB" in text and "ETA" in text and "bar" in text  # the table, redrawn
    assert text.count("JOB") >= 2  # more than one frame


async def test_report_per_batch_against_the_plans_with_a_gantt(etcd, registry, tmp_path, capsys):
    a, b, c = Job("a", 6, {1: 30.0}), Job("b", 4, {1: 30.0}), Job("c", 40, {1: 30.0})
    async with cluster(etcd, registry, tmp_path, [a, b, c]) as (address, d, stub):
        await submit(stub, a, c)  # batch 1: c is cancelled while it runs (a replan), a runs on
        await until(d, running("c"))
        await stub.CancelJob(planner_pb2.CancelJobRequest(job_id="c"), timeout=5)
        await until(d, terminal("a", "c"))
        code, out, _ = await omru(capsys, "report", "--planner", address)
        rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split()[:1] in (["a"], ["c"])}
        assert code == 0 and out.startswith("batch 1 of 1,") and rows["c"][1] == "cancelled", out
        # a started under the first plan, which a replan (c's cancel) followed: it is named
        assert rows["a"][5] != "-" and rows["a"][7] == "v1", rows["a"]
        await asyncio.sleep(1.5)  # an idle cluster parts two batches
        await submit(stub, b)
        await until(d, terminal("b"))
        await asyncio.sleep(0.5)

        code, out, err = await omru(capsys, "report", "--planner", address, "--gantt", str(tmp_path / "g.png"),
                                    "--json", str(tmp_path / "r.json"))
        assert code == 0, err
        assert out.startswith("batch 2 of 2, from ")
        assert "times count from " in out.splitlines()[1]  # (its first start: it began after an idle cluster)
        assert "planned by the first plan v1 (fifo)" in out and "planned at start" in out
        rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split()[:1] in (["a"], ["b"], ["c"])}
        assert set(rows) == {"b"}  # the newest batch only
        # not in the first plan ("-"); the plan in force at its start, named (the one in force now)
        assert rows["b"][1] == "finished" and rows["b"][5] == "-" and re.fullmatch(r"v\d+", rows["b"][7]), rows["b"]
        assert int(rows["b"][7][1:]) == (await stub.GetPlan(planner_pb2.GetPlanRequest(), timeout=5)).plan.version
        assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        doc = json.loads((tmp_path / "r.json").read_text())
        assert [j["job_id"] for j in doc["jobs"]] == ["b"] and doc["first_plan"] == "v1 (fifo)"
        assert doc["planned_at_start"]["b"]["plan"] == rows["b"][7]

        code, out, _ = await omru(capsys, "report", "--planner", address, "--batch", "1")
        assert code == 0 and out.startswith("batch 1 of 2"), out
        assert "times count from" not in out  # the first batch: from the first submission
        rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split()[:1] in (["a"], ["b"], ["c"])}
        assert set(rows) == {"a", "c"} and rows["c"][1] == "cancelled" and rows["a"][1] == "finished"
        assert rows["a"][7] == "1.8" or rows["a"][6] == "-"  # two plans later, which plan it was is not kept
        code, out, _ = await omru(capsys, "report", "--planner", address, "--batch", "all")
        assert code == 0 and all(re.search(rf"^{j} ", out, re.M) for j in "abc")
        assert "(not comparable: b not in it)" in out
        code, out, _ = await omru(capsys, "report", "--planner", address, "--since", "1h")
        assert code == 0 and "jobs active since" in out and all(re.search(rf"^{j} ", out, re.M) for j in "abc")


async def test_a_failed_job_shows_a_short_reason_and_its_whole_message_after_the_table(etcd, registry, tmp_path,
                                                                                          capsys):
    boom = Job("boom", 3, {1: 30.0})
    async with cluster(etcd, registry, tmp_path, []) as (address, d, stub):  # the emulation knows no "boom"
        await submit(stub, boom)
        await until(d, terminal("boom"))
        code, out, err = await omru(capsys, "status", "--planner", address)
        message = d.records["boom"].message
    assert code == 0 and d.records["boom"].state == "FAILED" and message, err
    row = next(line for line in out.splitlines() if line.startswith("boom "))
    assert row.split()[2] == "failed" and len(message) > 60  # (the planner's words and the node's)
    assert row.endswith(message[:59] + "…")  # the reason column: its first 60 characters
    assert f"boom failed: {message}" in out.splitlines()  # then the whole of it
