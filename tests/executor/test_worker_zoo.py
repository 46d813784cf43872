"""The model zoo builds every registered torchvision model for small inputs."""

from __future__ import annotations

import pytest
import torch

from services.executor.worker import zoo

torch.set_num_threads(1)


@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_every_zoo_model_classifies_a_small_input_into_the_requested_classes(name):
    entry = zoo.entry(name)
    frames = 4 if entry.kind == "video" else 0
    model = zoo.build_model(name, num_classes=7, image_size=16 if entry.kind == "video" else 32, frames=frames).eval()
    x = torch.randn(2, 3, 4, 16, 16) if frames else torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert model(x).shape == (2, 7)


def test_a_model_whose_stem_needs_more_pixels_gets_an_upsample_in_front():
    model = zoo.build_model("alexnet", num_classes=3, image_size=16).eval()
    assert isinstance(model[0], torch.nn.Upsample)
    with torch.no_grad():
        assert model(torch.randn(1, 3, 16, 16)).shape == (1, 3)
    assert not isinstance(zoo.build_model("resnet18", 3, 32), torch.nn.Sequential)


def test_an_unknown_model_name_lists_the_known_ones():
    with pytest.raises(zoo.UnknownModelError, match="known models: alexnet, densenet121"):
        zoo.entry("lenet5")
