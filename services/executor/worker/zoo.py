"""Model zoo: torchvision architectures, no pretrained weights, registered by name.

Every entry builds a fresh, randomly initialised model (``weights=None``) with a
configurable number of classes for a configurable input size. Image models take
``(N, 3, S, S)``; video models take ``(N, 3, T, S, S)``.

Small inputs: most torchvision image models pool adaptively and take 32x32 as
is. Where a model's fixed-stride stem would shrink a small input to nothing
(alexnet, googlenet, ...), the entry declares ``min_size`` and `build_model`
puts a bilinear (image) / trilinear (video) upsample to ``min_size`` in front of
the unchanged torchvision model. The architecture itself is never altered, so
epoch times still reflect the real network (plus the tiny upsample).

The registry (`MODELS`) is plain data and imports nothing heavy; torch and
torchvision are imported inside the builders.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class ModelEntry:
    """One registered architecture."""

    name: str
    kind: str  # "image" or "video"
    build: Callable[[int], object]  # num_classes -> nn.Module
    min_size: int = 1  # smallest spatial input the torchvision model accepts
    min_frames: int = 1  # smallest clip length (video)


MODELS: dict[str, ModelEntry] = {}


def register(name: str, kind: str = "image", min_size: int = 1, min_frames: int = 1):
    """Decorator: register ``fn(num_classes) -> nn.Module`` under ``name``."""

    def deco(fn: Callable[[int], object]) -> Callable[[int], object]:
        if name in MODELS:
            raise ValueError(f"model {name!r} registered twice")
        MODELS[name] = ModelEntry(name, kind, fn, min_size, min_frames)
        return fn

    return deco


class UnknownModelError(ValueError):
    """A model name that is not in the zoo."""


def entry(name: str) -> ModelEntry:
    try:
        return MODELS[name]
    except KeyError:
        known = ", ".join(sorted(MODELS))
        raise UnknownModelError(f"unknown model {name!r}; known models: {known}") from None


def _tv():
    import torchvision.models as tvm

    return tvm


@register("alexnet", min_size=63)
def _alexnet(n: int):
    return _tv().alexnet(weights=None, num_classes=n)


@register("vgg16", min_size=32)
def _vgg16(n: int):
    return _tv().vgg16(weights=None, num_classes=n)


@register("resnet18")
def _resnet18(n: int):
    return _tv().resnet18(weights=None, num_classes=n)


@register("resnet50")
def _resnet50(n: int):
    return _tv().resnet50(weights=None, num_classes=n)


@register("resnext50_32x4d")
def _resnext50(n: int):
    return _tv().resnext50_32x4d(weights=None, num_classes=n)


@register("googlenet", min_size=16)
def _googlenet(n: int):
    return _tv().googlenet(weights=None, num_classes=n, aux_logits=False, init_weights=True)


@register("densenet121", min_size=32)
def _densenet121(n: int):
    return _tv().densenet121(weights=None, num_classes=n)


@register("mobilenet_v3_small")
def _mobilenet_v3_small(n: int):
    return _tv().mobilenet_v3_small(weights=None, num_classes=n)


def _video():
    import torchvision.models.video as tvv

    return tvv


@register("r3d_18", kind="video", min_size=8)
def _r3d_18(n: int):
    return _video().r3d_18(weights=None, num_classes=n)


@register("mc3_18", kind="video", min_size=8)
def _mc3_18(n: int):
    return _video().mc3_18(weights=None, num_classes=n)


@register("r2plus1d_18", kind="video", min_size=8)
def _r2plus1d_18(n: int):
    return _video().r2plus1d_18(weights=None, num_classes=n)


def build_model(name: str, num_classes: int, image_size: int, frames: int = 0):
    """A fresh model for inputs of ``image_size`` (and ``frames`` for video)."""
    import torch.nn as nn

    e = entry(name)
    model = e.build(num_classes)
    if image_size < e.min_size or (e.kind == "video" and frames < e.min_frames):
        if e.kind == "video":
            size = (max(frames, e.min_frames), max(image_size, e.min_size), max(image_size, e.min_size))
            up = nn.Upsample(size=size, mode="trilinear", align_corners=False)
        else:
            size = (e.min_size, e.min_size)
            up = nn.Upsample(size=size, mode="bilinear", align_corners=False)
        model = nn.Sequential(up, model)
    return model
