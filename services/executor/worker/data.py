"""Training data: a train split and a held-out split, nothing downloaded.

``digits``            scikit-learn's handwritten digits (1,797 real 8x8 images
                      in 10 classes, shipped with scikit-learn). Fixed split
                      (seed 0, independent of the job seed): 1,438 train / 359
                      test. Each image is scaled to [0, 1], normalised, upsampled
                      bilinearly to ``image_size`` and repeated to 3 channels.
``synthetic``         seeded random tensors of the job's shape, images
                      ``(3, S, S)`` or clips ``(3, T, S, S)``, labels uniform
                      in ``num_classes`` (10 by default); for timing, not accuracy.
``imagefolder:<dir>`` torchvision ImageFolder (one subfolder per class). If
                      ``<dir>/train`` and ``<dir>/val`` exist they are the splits,
                      otherwise a fixed seeded 80/20 split of ``<dir>``.
``clips:<dir>``       one subfolder per class of ``.pt`` files, each a clip tensor
                      ``(C, T, H, W)`` (C = 1 or 3) loaded with
                      ``torch.load(weights_only=True)`` and resized to
                      ``(3, frames, S, S)``. Splits as for imagefolder.

`load(spec)` returns a `Splits` (train, test, num_classes). ``train_samples``
caps the training split (a seeded subset) for tiny runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, Subset

from services.executor.worker.spec import TrainSpec, dataset_kind

SPLIT_SEED = 0
SYNTHETIC_TRAIN = 1024
SYNTHETIC_TEST = 256
_MEAN, _STD = 0.5, 0.5


class DataError(ValueError):
    """A data set that cannot be used (missing folder, empty class, bad tensor)."""


@dataclass(frozen=True)
class Splits:
    train: Dataset
    test: Dataset
    num_classes: int


class _TensorImages(Dataset):
    """Small images held at native resolution, upsampled per item."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, size: int):
        self.images, self.labels, self.size = images, labels, size

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        x = self.images[i : i + 1]  # (1, 1, h, w)
        if x.shape[-1] != self.size:
            x = F.interpolate(x, size=(self.size, self.size), mode="bilinear", align_corners=False)
        return x[0].expand(3, -1, -1).contiguous(), int(self.labels[i])


class _Synthetic(Dataset):
    """Deterministic random samples: item i is generated from seed + i."""

    def __init__(self, n: int, shape: tuple[int, ...], num_classes: int, seed: int):
        self.n, self.shape, self.num_classes, self.seed = n, shape, num_classes, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        x = torch.randn(self.shape, generator=g)
        y = int(torch.randint(self.num_classes, (1,), generator=g))
        return x, y


class _Clips(Dataset):
    def __init__(self, items: list[tuple[str, int]], frames: int, size: int):
        self.items, self.frames, self.size = items, frames, size

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        path, label = self.items[i]
        clip = torch.load(path, weights_only=True)
        if not isinstance(clip, torch.Tensor) or clip.dim() != 4 or clip.shape[0] not in (1, 3):
            raise DataError(f"clip {path} must hold a tensor (C, T, H, W) with C = 1 or 3, got "
                            f"{getattr(clip, 'shape', type(clip).__name__)}")
        clip = clip.float()
        if clip.max() > 1.5:  # uint8-range clips
            clip = clip / 255.0
        clip = F.interpolate(clip.unsqueeze(0), size=(self.frames, self.size, self.size), mode="trilinear",
                             align_corners=False)[0]
        clip = clip.expand(3, -1, -1, -1)
        return (clip - _MEAN) / _STD, label


def _seeded_split(n: int, test_fraction: float = 0.2) -> tuple[list[int], list[int]]:
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(SPLIT_SEED)).tolist()
    n_test = max(1, int(round(n * test_fraction)))
    return sorted(perm[n_test:]), sorted(perm[:n_test])


def _digits(spec: TrainSpec) -> Splits:
    from sklearn.datasets import load_digits

    d = load_digits()
    images = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    images = (images - _MEAN) / _STD
    labels = torch.tensor(d.target, dtype=torch.long)
    full = _TensorImages(images, labels, spec.image_size)
    train_idx, test_idx = _seeded_split(len(labels))
    return Splits(Subset(full, train_idx), Subset(full, test_idx), 10)


def _synthetic(spec: TrainSpec) -> Splits:
    n_classes = spec.num_classes or 10
    shape = (3, spec.frames, spec.image_size, spec.image_size) if spec.frames else (3, spec.image_size, spec.image_size)
    n_train = spec.train_samples or SYNTHETIC_TRAIN
    return Splits(_Synthetic(n_train, shape, n_classes, spec.seed),
                  _Synthetic(SYNTHETIC_TEST, shape, n_classes, spec.seed + 1), n_classes)


def _class_folders(root: str) -> list[str]:
    if not os.path.isdir(root):
        raise DataError(f"data folder {root!r} does not exist")
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    if len(classes) < 2:
        raise DataError(f"data folder {root!r} needs one subfolder per class (at least 2), found {len(classes)}")
    return classes


def _split_roots(root: str) -> tuple[str, str] | None:
    train, val = os.path.join(root, "train"), os.path.join(root, "val")
    return (train, val) if os.path.isdir(train) and os.path.isdir(val) else None


def _image_folder(root: str, transform):
    """torchvision's ImageFolder of root; DataError when a class folder holds no image (torchvision's own
    message would list the empty class folders: an error never lists a folder's content)."""
    from torchvision import datasets

    try:
        return datasets.ImageFolder(root, transform=transform)
    except FileNotFoundError:
        raise DataError(f"data folder {root!r}: not every class folder holds an image file "
                        f"({', '.join(datasets.folder.IMG_EXTENSIONS)})") from None


def _imagefolder(spec: TrainSpec, root: str) -> Splits:
    from torchvision import transforms

    tf = transforms.Compose([
        transforms.Resize((spec.image_size, spec.image_size)),
        transforms.ToTensor(),
        transforms.Normalize([_MEAN] * 3, [_STD] * 3),
    ])
    roots = _split_roots(root)
    if roots:
        for r in roots:
            _class_folders(r)
        train, test = _image_folder(roots[0], tf), _image_folder(roots[1], tf)
        return Splits(train, test, len(train.classes))
    _class_folders(root)
    full = _image_folder(root, tf)
    tr, te = _seeded_split(len(full))
    return Splits(Subset(full, tr), Subset(full, te), len(full.classes))


def _clip_items(root: str) -> tuple[list[tuple[str, int]], int]:
    classes = _class_folders(root)
    items, empty = [], 0
    for label, c in enumerate(classes):
        files = sorted(f for f in os.listdir(os.path.join(root, c)) if f.endswith(".pt"))
        items += [(os.path.join(root, c, f), label) for f in files]
        empty = empty + 1 if not files else empty
    if empty:
        raise DataError(f"data folder {root!r}: {empty} of its {len(classes)} class folders hold no .pt clips")
    return items, len(classes)


def _clips(spec: TrainSpec, root: str) -> Splits:
    roots = _split_roots(root)
    if roots:
        (train, n), (test, _) = _clip_items(roots[0]), _clip_items(roots[1])
    else:
        items, n = _clip_items(root)
        tr, te = _seeded_split(len(items))
        train, test = [items[i] for i in tr], [items[i] for i in te]
    return Splits(_Clips(train, spec.frames, spec.image_size), _Clips(test, spec.frames, spec.image_size), n)


_LOADERS = {
    "digits": lambda spec, _arg: _digits(spec),
    "synthetic": lambda spec, _arg: _synthetic(spec),
    "imagefolder": _imagefolder,
    "clips": _clips,
}


def load(spec: TrainSpec) -> Splits:
    """The train and test splits of ``spec.dataset``, shaped for ``spec``'s model."""
    kind, arg = dataset_kind(spec.dataset)
    splits = _LOADERS[kind](spec, arg)
    if spec.num_classes and kind != "synthetic" and spec.num_classes < splits.num_classes:
        raise DataError(f"num_classes {spec.num_classes} is smaller than the {splits.num_classes} classes of {spec.dataset!r}")
    train = splits.train
    if spec.train_samples and spec.train_samples < len(train) and kind != "synthetic":
        keep = torch.randperm(len(train), generator=torch.Generator().manual_seed(spec.seed)).tolist()
        train = Subset(train, sorted(keep[: spec.train_samples]))
    return Splits(train, splits.test, spec.num_classes or splits.num_classes)
