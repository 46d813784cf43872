"""The workload YAML loader: valid files load, every problem is named at once."""

from __future__ import annotations

import pytest

from omru import workload
from omru.workload import WorkloadError
from services.executor.worker.spec import SpecError

GOOD = """
policy: omru-ga
defaults:
  dataset: digits
  batch_size: 16
  base_lr: 0.05
jobs:
  - id: a
    model: resnet18
    epochs: 3
    max_gpus: 2
    profile: {1: 4.0, 2: 2.5}
  - id: b
    model: mobilenet_v3_small
    epochs: 2
    batch_size: 32
"""


def test_a_valid_workload_loads_with_defaults_applied_and_job_values_winning():
    w = workload.parse(GOOD)
    assert w.policy == "omru-ga"
    assert [j.id for j in w.jobs] == ["a", "b"]
    a, b = w.jobs
    assert a.spec.batch_size == 16 and a.spec.base_batch == 16 and a.spec.base_lr == 0.05
    assert b.spec.batch_size == 32 and b.spec.base_batch == 32
    assert a.max_gpus == 2 and b.max_gpus == 0
    assert dict(a.profile) == {1: 4.0, 2: 2.5} and dict(b.profile) == {}


def test_the_same_id_twice_with_the_same_spec_is_one_job():
    text = GOOD + "  - id: b\n    model: mobilenet_v3_small\n    epochs: 2\n    batch_size: 32\n"
    assert [j.id for j in workload.parse(text).jobs] == ["a", "b"]


def test_every_problem_of_a_bad_workload_is_named_in_one_error():
    text = """
jobs:
  - id: x
    model: no-such-net
    epochs: -3
  - id: y
    model: resnet18
    epochs: 2
  - id: y
    model: resnet18
    epochs: 5
  - id: z
    model: resnet18
    epochs: 1
    min_gpus: 9
"""
    with pytest.raises(WorkloadError) as err:
        workload.parse(text, cluster_gpus=4)
    msg = str(err.value)
    assert "job 'x': model: unknown model 'no-such-net'" in msg
    assert "job 'x': epochs: must be >= 1, got -3" in msg
    assert "job 'y': id given twice with different specs (differs in epochs)" in msg
    assert "job 'z': min_gpus: needs 9 GPUs, the cluster has 4" in msg
    assert len(err.value.problems) == 4


@pytest.mark.parametrize(
    "text, named",
    [
        ("jobs: []", "jobs: must be a non-empty list"),
        ("jobz: []", "unknown top-level key 'jobz'"),
        ("jobs:\n  - model: resnet18", "id: missing"),
        ("jobs:\n  - id: a\n    model: resnet18\n    colour: red", "unknown field 'colour'"),
        ("jobs:\n  - id: a\n    model: resnet18\n    profile: {1: -2}", "seconds per epoch on 1 GPUs must be > 0, got -2"),
        ("jobs:\n  - id: a\n    model: resnet18\n    max_gpus: 8", "max_gpus: 8 GPUs asked, the cluster has 2"),
        ("jobs:\n  - id: a b\n    model: resnet18", "job_id: must be 1-128 characters"),
        ("jobs: [: bad", "not valid YAML"),
        ("jobs:\n  - id: s\n    command: []", "job 's': command: must be a non-empty list of strings"),
        ("jobs:\n  - id: s\n    command: python x.py", "job 's': command: must be a non-empty list of strings (program, arguments), got 'python x.py'"),
        ("jobs:\n  - id: s\n    command: [python, 3]", "command: must be a list of non-empty strings (program, arguments), got ['python', 3]"),
        ("jobs:\n  - id: s\n    command: [python, x.py]\n    model: resnet18", "job 's': model: a script job (command 'python') has no model, got 'resnet18'"),
        ("jobs:\n  - id: s\n    command: [python, x.py]\n    workdir: code", "job 's': workdir: must be an absolute folder path, got 'code'"),
        ("jobs:\n  - id: s\n    command: [python, x.py]\n    env: {MASTER_PORT: '1'}", "env: MASTER_PORT is set by the executor"),
        ("jobs:\n  - id: s\n    command: [python, x.py]\n    env: {SEED: 1}", "env: SEED: must be a string, got 1"),
        ("jobs:\n  - id: a\n    model: resnet18\n    workdir: /tmp", "job 'a': workdir: only a script job (command) has one"),
        ("jobs:\n  - id: a\n    epochs: 2", "job 'a': model: missing (a model of the zoo, or a command"),
    ],
)
def test_a_bad_workload_is_rejected_naming_the_bad_value(text, named):
    with pytest.raises(WorkloadError) as err:
        workload.parse(text, cluster_gpus=2)
    assert named in str(err.value)


def test_a_script_job_loads_without_the_zoo_defaults_and_survives_the_trip_through_the_api():
    from services.planner import convert

    w = workload.parse("""
defaults: {dataset: digits, image_size: 64, batch_size: 16}
jobs:
  - id: mine
    command: [python, train.py, --data, /shared/x]
    workdir: /shared/code
    env: {SEED: "1"}
    epochs: 4
    max_gpus: 2
""")
    (job,) = w.jobs
    s = job.spec
    assert s.is_script and (s.command, s.workdir, dict(s.env)) == (("python", "train.py", "--data", "/shared/x"),
                                                                  "/shared/code", {"SEED": "1"})
    assert (s.model, s.dataset, s.batch_size, s.epochs) == ("", "", 16, 4)  # zoo defaults not taken, the rest are
    proto = convert.job_spec(job)
    assert list(proto.command) == list(s.command) and dict(proto.env) == {"SEED": "1"} and not proto.model
    assert convert.workload_job(proto) == job  # what the planner stores is what was sent
    with pytest.raises(SpecError) as err:  # the planner's SubmitJobs refuses both model and command
        convert.workload_job(convert.job_spec(job).__class__(job_id="x", model="resnet18", command=["python"],
                                                              epochs=1, batch_size=8))
    assert err.value.field == "model"


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(WorkloadError, match="cannot read"):
        workload.load(str(tmp_path / "absent.yaml"))
