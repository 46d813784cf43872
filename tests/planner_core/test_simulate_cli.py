"""`omru simulate`: output on the paper's data, partial profiles, policy options, and bad input ->
exit 2 with the problem named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core_builders import CORE_POLICIES, PROFILES_CSV
from omru.cli.commands.simulate import parse_options
from omru.cli.main import main
from services.planner.core import profiles, registry
from services.planner.core.model import Cluster, PlanningInput

ROOT = Path(__file__).resolve().parents[2]
GOOD_ROWS = "job,epochs,gpus,epoch_seconds\na,10,1,4.0\na,10,2,2.5\nb,5,1,3.0\nb,5,2,2.0\n"
# Rows at 1, 2 and 4 GPUs only (job c: at 2 and 4), for a cluster of 16.
PARTIAL_ROWS = ("job,epochs,gpus,epoch_seconds\na,10,1,40.0\na,10,2,25.0\na,10,4,15.0\n"
                "b,5,1,30.0\nb,5,2,20.0\nb,5,4,12.0\nc,8,2,22.0\nc,8,4,14.0\n")


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["simulate", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def csv_file(tmp_path, text: str) -> Path:
    path = tmp_path / "profiles.csv"
    path.write_text(text)
    return path


def test_json_output_has_the_documented_keys_and_the_reference_makespan(capsys):
    code, out, _ = run(capsys, "--profiles", PROFILES_CSV, "--task", "image", "--gpus", 8, "--policy", "omru-ga", "--json")
    assert code == 0
    result = json.loads(out)
    assert set(result) == {
        "policy", "gpus", "jobs", "makespan_s", "utilization", "reference_utilization",
        "lower_bounds", "plan_seconds", "segments",
    }
    assert set(result["lower_bounds"]) == {"length_s", "area_s", "fluid_s", "static_s"}
    assert (result["policy"], result["gpus"], result["jobs"]) == ("omru-ga", 8, 6)
    assert round(result["makespan_s"] / 60) == 135
    assert result["reference_utilization"] == pytest.approx(0.97996, abs=1e-4)
    assert result["makespan_s"] >= result["lower_bounds"]["fluid_s"]
    assert set(result["segments"][0]) == {"job", "start_s", "end_s", "gpus", "epochs"}
    epochs = {}
    for s in result["segments"]:
        epochs[s["job"]] = epochs.get(s["job"], 0) + s["epochs"]
    assert epochs == dict.fromkeys(("alexnet", "resnet50", "resnext50", "seresnet101", "googlenet", "vgg16"), 200)


def test_human_output_shows_the_table_makespan_utilisation_and_bounds(capsys, tmp_path):
    code, out, _ = run(capsys, "--profiles", csv_file(tmp_path, GOOD_ROWS), "--gpus", 2, "--gpus-per-node", 1,
                       "--policy", "sequential")
    assert code == 0
    for word in ("makespan", "utilisation", "fluid", "static", "length", "area"):
        assert word in out
    assert out.count("\na ") + out.count("\nb ") == 2  # one row per segment


@pytest.mark.parametrize(
    "text, args, message",
    [
        (GOOD_ROWS.replace("a,10,2,2.5", "a,10,2,-1"), ("--gpus", 2), "epoch_seconds must be positive, got '-1'"),
        (GOOD_ROWS.replace("a,10,2,2.5", "a,10,2,0"), ("--gpus", 2), "epoch_seconds must be positive"),
        (GOOD_ROWS.replace("b,5,", "b,0,"), ("--gpus", 2), "epochs must be positive, got '0'"),
        (GOOD_ROWS, ("--gpus", 2, "--policy", "fastest"), "unknown policy 'fastest'"),
        ("job,epochs,gpu,seconds\na,1,1,2\n", ("--gpus", 1), "missing column(s) gpus, epoch_seconds"),
        (GOOD_ROWS + "b,5,3\n", ("--gpus", 2), "line 6: expected 4 fields"),
        (GOOD_ROWS + "b,5,3,2,9\n", ("--gpus", 2), "line 6: expected 4 fields"),
        (GOOD_ROWS.replace("a,10,1,4.0", "a,10,one,4.0"), ("--gpus", 2), "line 2: gpus 'one' is not an integer"),
        (GOOD_ROWS.replace("b,5,1,3.0", "b,6,1,3.0"), ("--gpus", 2), "job 'b' has epochs 5 here but 6 earlier"),
        ("", ("--gpus", 2), "missing column(s)"),
        (GOOD_ROWS, ("--gpus", 2, "--task", "image"), "no 'task' column"),
        (GOOD_ROWS, ("--gpus", 2, "--gpus-per-node", 3), "not a multiple of gpus per node (3)"),
        (GOOD_ROWS, ("--gpus", 0), "gpus must be a positive integer, got 0"),
        (GOOD_ROWS, ("--gpus", 2, "--option", "population=x"), "population must be an integer >= 2, got 'x'"),
        (GOOD_ROWS, ("--gpus", 2, "--option", "generations=-3"), "generations must be an integer >= 0, got -3"),
        (GOOD_ROWS, ("--gpus", 2, "--option", "populations=20"),
         "policy 'omru-ga' has no option 'populations'; its options: generations, population"),
        (GOOD_ROWS, ("--gpus", 2, "--option", "seed=3"), "no option 'seed' (the seed is --seed)"),
        (GOOD_ROWS, ("--gpus", 2, "--policy", "sequential", "--option", "population=20"),
         "policy 'sequential' has no option 'population'; its options: none"),
        (GOOD_ROWS, ("--gpus", 2, "--option", "population"), "--option 'population' is not KEY=VALUE"),
        (GOOD_ROWS, ("--gpus", 2, "--option", "=3"), "--option '=3' is not KEY=VALUE"),
        (GOOD_ROWS, ("--gpus", 2, "--option", "population=4", "--option", "population=6"),
         "--option population given twice"),
    ],
    ids=["negative-time", "zero-time", "zero-epochs", "unknown-policy", "missing-columns", "short-row",
         "long-row", "not-a-number", "inconsistent-epochs", "empty-file", "task-without-column",
         "nodes-do-not-divide", "zero-gpus", "option-not-a-number", "option-out-of-range", "unknown-option",
         "seed-as-option", "option-of-another-policy", "option-without-value", "option-without-key",
         "option-twice"],
)
def test_bad_input_exits_2_with_one_line_naming_the_problem(capsys, tmp_path, text, args, message):
    argv = ["--profiles", csv_file(tmp_path, text), *args]
    if "--policy" not in args:
        argv += ["--policy", "omru-ga"]
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert out == ""


def test_unreadable_profiles_file_exits_2_naming_the_path(capsys, tmp_path):
    code, _, err = run(capsys, "--profiles", tmp_path / "nope.csv", "--gpus", 2, "--policy", "sequential")
    assert code == 2 and "nope.csv" in err


def test_unknown_task_names_the_tasks_there_are(capsys):
    code, _, err = run(capsys, "--profiles", PROFILES_CSV, "--task", "audio", "--gpus", 2, "--policy", "sequential")
    assert code == 2 and "no rows for task 'audio' (tasks: action, image)" in err


def test_the_installed_command_reports_bad_input_without_a_traceback(tmp_path):
    bad = csv_file(tmp_path, GOOD_ROWS.replace("a,10,2,2.5", "a,10,2,-1"))
    proc = subprocess.run(
        [sys.executable, "-m", "omru", "simulate", "--profiles", str(bad), "--gpus", "2", "--policy", "omru-ga"],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120,
    )
    assert proc.returncode == 2
    assert "epoch_seconds must be positive, got '-1'" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("policy", ["omru", "omru-ga", "sequential", "parallel", "tiresias"])
def test_a_profile_with_rows_at_1_2_and_4_gpus_plans_on_16_gpus(capsys, tmp_path, policy):
    code, out, err = run(capsys, "--profiles", csv_file(tmp_path, PARTIAL_ROWS), "--gpus", 16, "--gpus-per-node", 4,
                         "--policy", policy, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["gpus"] == 16 and result["jobs"] == 3
    epochs: dict[str, int] = {}
    for s in result["segments"]:
        assert len(s["gpus"]) <= 4, s
        epochs[s["job"]] = epochs.get(s["job"], 0) + s["epochs"]
    assert epochs == {"a": 10, "b": 5, "c": 8}
    assert result["makespan_s"] * (1 + 1e-9) >= result["lower_bounds"]["fluid_s"]


def test_options_reach_the_policy(capsys):
    jobs = profiles.load_csv(PROFILES_CSV, task="image")
    small = {"population": 2, "generations": 0}
    direct = registry.plan("omru-ga", PlanningInput(tuple(jobs), Cluster.of(8), seed=3, options=small))
    default = registry.plan("omru-ga", PlanningInput(tuple(jobs), Cluster.of(8), seed=3))
    assert direct.makespan_s != default.makespan_s  # (else this test could not tell them apart)
    code, out, _ = run(capsys, "--profiles", PROFILES_CSV, "--task", "image", "--gpus", 8, "--policy", "omru-ga",
                       "--seed", 3, "--option", "population=2", "--option", "generations=0", "--json")
    assert code == 0
    assert json.loads(out)["makespan_s"] == direct.makespan_s


@pytest.mark.parametrize("policy", CORE_POLICIES)
def test_every_option_a_policy_declares_is_read_and_checked(capsys, tmp_path, policy):
    for key in registry.options(policy):
        code, out, err = run(capsys, "--profiles", csv_file(tmp_path, GOOD_ROWS), "--gpus", 2, "--policy", policy,
                             "--option", f"{key}=bogus")
        assert code == 2 and out == ""
        assert key in err and "'bogus'" in err, err


def test_option_values_are_integers_else_finite_numbers_else_strings():
    parsed = parse_options(["a=3", "b=2.5", "c=1e3", "d=fast", "e=inf", "f=nan", "g= 7 "])
    assert parsed == {"a": 3, "b": 2.5, "c": 1000.0, "d": "fast", "e": "inf", "f": "nan", "g": 7}
    assert [type(parsed[k]) for k in "abcd"] == [int, float, float, str]
