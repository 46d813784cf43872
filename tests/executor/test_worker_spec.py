"""Pure parts of the worker: spec validation, the linear scaling rule, checkpoint files, data splits."""

from __future__ import annotations

import os

import pytest
import torch

from omru import checkpoint, lsr
from services.executor.worker import data
from services.executor.worker.spec import AttemptSpec, ProfileSpec, SpecError, TrainSpec, from_json, to_json


def a_spec(**kw) -> TrainSpec:
    return TrainSpec(**{"job_id": "j1", "model": "resnet18", **kw})


@pytest.mark.parametrize("field,value", [
    ("job_id", ""), ("job_id", "has space"), ("model", "resnet19"), ("dataset", "mnist"),
    ("dataset", "imagefolder:"), ("epochs", 0), ("epochs", 2.5), ("batch_size", 0), ("base_lr", 0.0),
    ("base_lr", -1.0), ("base_batch", 0), ("warmup_epochs", -1), ("momentum", 1.0), ("weight_decay", -0.1),
    ("num_classes", 1), ("num_classes", -3), ("image_size", 0), ("frames", 4), ("min_gpus", 0),
    ("max_gpus", 0), ("seed", -1), ("train_samples", -5), ("lr_decay", "step"), ("epochs", True),
])
def test_a_bad_train_spec_value_is_refused_naming_the_field(field, value):
    with pytest.raises(SpecError) as err:
        a_spec(**{field: value})
    assert err.value.field == field
    assert str(err.value).startswith(f"{field}:")
    assert isinstance(err.value, ValueError)


def test_an_unknown_model_error_lists_the_known_models():
    with pytest.raises(SpecError, match="known models: .*resnet18.*vgg16"):
        a_spec(model="lenet")


def test_max_gpus_below_min_gpus_is_refused():
    with pytest.raises(SpecError) as err:
        a_spec(min_gpus=4, max_gpus=2)
    assert err.value.field == "max_gpus"


def test_video_models_need_frames_and_clip_data():
    with pytest.raises(SpecError) as err:
        a_spec(model="r3d_18", dataset="synthetic")
    assert err.value.field == "frames"
    with pytest.raises(SpecError) as err:
        a_spec(model="r3d_18", frames=4, dataset="digits")
    assert err.value.field == "dataset"
    assert a_spec(model="r3d_18", frames=4, dataset="synthetic").is_video


@pytest.mark.parametrize("field,value", [
    ("world_size", 0), ("rendezvous", "nohost"), ("rendezvous", "h:99999"), ("checkpoint_dir", ""),
    ("devices", ("cpu",)), ("devices", ("cpu", "gpu0")), ("attempt_id", "a/b"), ("timeout_s", 0),
])
def test_a_bad_attempt_value_is_refused_naming_the_field(field, value):
    kw = {"attempt_id": "a1", "world_size": 2, "rendezvous": "127.0.0.1:1234", "checkpoint_dir": "ck", field: value}
    with pytest.raises(SpecError) as err:
        AttemptSpec(**kw)
    assert err.value.field == field


def test_a_bad_profile_mode_is_refused():
    with pytest.raises(SpecError) as err:
        ProfileSpec(mode="fast")
    assert err.value.field == "profile.mode"


def test_specs_round_trip_through_json_and_unknown_fields_are_refused():
    spec = a_spec(epochs=3, lr_decay="cosine")
    attempt = AttemptSpec("a1", 2, "127.0.0.1:1234", "ck", devices=("0", "1"), profile=ProfileSpec("epoch", 1, 2))
    assert from_json(to_json(spec, attempt)) == (spec, attempt)
    with pytest.raises(SpecError) as err:
        TrainSpec.from_dict({**spec.to_dict(), "colour": "red"})
    assert err.value.field == "colour"


def test_lsr_scales_the_lr_with_the_global_batch_after_warmup():
    s = lsr.new_job(base_lr=0.1, base_batch=256, batch_size=64, world_size=8, warmup_epochs=5)
    assert s.global_batch == 512
    assert s.lr(0) == pytest.approx(0.1)
    assert s.lr(2.5) == pytest.approx(0.15)
    assert s.lr(5) == pytest.approx(0.2) == s.lr(50)


def test_lsr_without_warmup_starts_at_the_target():
    s = lsr.new_job(0.1, 32, 32, 4, warmup_epochs=0)
    assert s.lr(0) == pytest.approx(0.4)


def test_a_resize_rewarms_from_the_current_lr_to_the_new_target_over_one_epoch():
    s = lsr.new_job(0.1, 32, 32, 2, warmup_epochs=1)  # target 0.2, reached at epoch 1
    r = lsr.resumed(s, epoch=3, base_lr=0.1, base_batch=32, batch_size=32, world_size=4)
    assert r.lr(3) == pytest.approx(0.2)
    assert r.lr(3.5) == pytest.approx(0.3)
    assert r.lr(4) == pytest.approx(0.4) == r.lr(9)
    down = lsr.resumed(r, epoch=10, base_lr=0.1, base_batch=32, batch_size=32, world_size=1)
    assert down.lr(10) == pytest.approx(0.4) and down.lr(11) == pytest.approx(0.1)


def test_a_resize_during_warmup_keeps_the_rest_of_the_warmup():
    s = lsr.new_job(0.1, 32, 32, 1, warmup_epochs=5)  # target 0.1: flat
    r = lsr.resumed(s, epoch=2, base_lr=0.1, base_batch=32, batch_size=32, world_size=4)
    assert r.ramp_epochs == pytest.approx(3)
    assert r.lr(2) == pytest.approx(0.1) and r.lr(5) == pytest.approx(0.4)


def test_a_restart_on_the_same_world_size_keeps_the_schedule():
    s = lsr.new_job(0.1, 32, 32, 2, warmup_epochs=5)
    assert lsr.resumed(s, 3, 0.1, 32, 32, 2) == s


def test_cosine_decay_depends_on_progress_only_and_survives_a_resize():
    s = lsr.new_job(0.1, 32, 32, 2, warmup_epochs=0, decay="cosine", total_epochs=10)
    assert s.lr(0) == pytest.approx(0.2) and s.lr(5) == pytest.approx(0.1) and s.lr(10) == pytest.approx(0.0)
    r = lsr.resumed(s, 5, 0.1, 32, 32, 4)
    assert r.lr(5) == pytest.approx(0.1)  # undecayed 0.2 x cos factor 0.5
    assert r.lr(6) == pytest.approx(0.4 * 0.5 * (1 + torch.cos(torch.tensor(torch.pi * 0.6)).item()))


def _state(model_name: str, spec: TrainSpec, epoch: int) -> dict:
    return {"job_id": spec.job_id, "model_name": model_name, "fingerprint": spec.fingerprint(), "epoch": epoch,
            "model": {"w": torch.ones(2)}, "history": [{"epoch": epoch}]}


def test_checkpoints_are_written_atomically_and_only_the_two_newest_are_kept(tmp_path):
    spec = a_spec()
    for e in (1, 2, 3):
        checkpoint.save(str(tmp_path), _state("resnet18", spec, e))
    assert sorted(os.listdir(tmp_path)) == ["epoch-00002.pt", "epoch-00003.pt"]
    assert checkpoint.latest(str(tmp_path)).endswith("epoch-00003.pt")
    state = checkpoint.load(checkpoint.latest(str(tmp_path)), "resnet18", spec.fingerprint())
    assert state["epoch"] == 3 and torch.equal(state["model"]["w"], torch.ones(2))


def test_a_checkpoint_of_another_model_is_refused_naming_both_models(tmp_path):
    path = checkpoint.save(str(tmp_path), _state("alexnet", a_spec(model="alexnet"), 1))
    with pytest.raises(checkpoint.CheckpointError, match="holds model 'alexnet', but this job trains 'resnet18'"):
        checkpoint.load(path, "resnet18", a_spec().fingerprint())


def test_a_checkpoint_of_another_configuration_of_the_same_model_is_refused(tmp_path):
    path = checkpoint.save(str(tmp_path), _state("resnet18", a_spec(num_classes=100), 1))
    with pytest.raises(checkpoint.CheckpointError, match="another resnet18 configuration"):
        checkpoint.load(path, "resnet18", a_spec().fingerprint())


class _Arbitrary:
    """Any class: unpickling it would run arbitrary code paths."""


def test_a_pickled_object_in_a_checkpoint_is_not_loaded(tmp_path):
    path = tmp_path / "epoch-00001.pt"
    torch.save({"format": 1, "obj": _Arbitrary()}, path)
    with pytest.raises(checkpoint.CheckpointError, match="cannot be read"):
        checkpoint.load(str(path), "resnet18", a_spec().fingerprint())


def test_digits_have_a_fixed_split_of_real_images_upsampled_to_the_input_size():
    a, b = data.load(a_spec(image_size=32)), data.load(a_spec(image_size=16, seed=7))
    assert (len(a.train), len(a.test), a.num_classes) == (1438, 359, 10)
    assert a.test.indices == b.test.indices
    x, y = a.train[0]
    assert x.shape == (3, 32, 32) and 0 <= y < 10 and b.train[0][0].shape == (3, 16, 16)
    assert len(data.load(a_spec(train_samples=100)).train) == 100


def test_synthetic_data_is_seeded_and_shaped_like_the_job():
    s = a_spec(model="r3d_18", dataset="synthetic", frames=4, image_size=16, num_classes=5, train_samples=12)
    a, b = data.load(s), data.load(s)
    assert len(a.train) == 12 and a.num_classes == 5
    assert a.train[3][0].shape == (3, 4, 16, 16) and torch.equal(a.train[3][0], b.train[3][0])


def test_imagefolder_and_clip_folders_load_one_class_per_subfolder(tmp_path):
    from PIL import Image

    for c in ("cat", "dog"):
        (tmp_path / "img" / c).mkdir(parents=True)
        (tmp_path / "clips" / c).mkdir(parents=True)
        for i in range(5):
            Image.new("RGB", (20, 12), (i * 40, 0, 0)).save(tmp_path / "img" / c / f"{i}.png")
            torch.save(torch.rand(1, 6, 10, 10), tmp_path / "clips" / c / f"{i}.pt")
    imgs = data.load(a_spec(dataset=f"imagefolder:{tmp_path / 'img'}", image_size=24))
    assert imgs.num_classes == 2 and len(imgs.train) + len(imgs.test) == 10 and imgs.train[0][0].shape == (3, 24, 24)
    clips = data.load(a_spec(model="mc3_18", dataset=f"clips:{tmp_path / 'clips'}", frames=4, image_size=16))
    assert clips.num_classes == 2 and clips.test[0][0].shape == (3, 4, 16, 16)


def test_a_missing_data_folder_is_reported_by_path(tmp_path):
    with pytest.raises(data.DataError, match="does not exist"):
        data.load(a_spec(dataset=f"imagefolder:{tmp_path / 'nope'}"))
