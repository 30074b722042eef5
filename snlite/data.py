"""Data sets for training: a synthetic task, scikit-learn's 8x8 digits, MNIST and CIFAR-10 from local files.

    train, test = snlite.data.digits()               # 1,437 / 360 images of 1x8x8, classes "0".."9"
    for x, labels in train.batches(32, shuffle=True, seed=epoch):
        model.step(x, labels, lr=0.05)

Every loader returns :class:`Dataset` objects: ``x`` float32 (N, C, H, W), ``labels`` int32 (N,).
Nothing is downloaded. ``mnist`` and ``cifar10`` read the original files from a directory you
give, and check them: a truncated or corrupt file is an error that names the file, what was
expected and what was found.

=============  ===========  ==========  ========================================================
loader         images       shape       source
=============  ===========  ==========  ========================================================
synthetic      any number   any         generated here: which region holds a bright blob
digits         1,797        1 x 8 x 8   bundled with scikit-learn (``pip install -e ".[digits]"``)
mnist          70,000       1 x 28 x 28 the four IDX files (optionally .gz) in a directory
cifar10        60,000       3 x 32 x 32 the six binary batches (``cifar-10-binary.tar.gz``)
=============  ===========  ==========  ========================================================
"""
from __future__ import annotations

import gzip
import math
import os
from dataclasses import dataclass

import numpy as np


class DataError(ValueError):
    """A data file that is not what its format says it should be."""


@dataclass(frozen=True)
class Dataset:
    """Images and their labels: ``x`` float32 (N, C, H, W), ``labels`` int32 (N,) in [0, len(classes))."""

    x: np.ndarray
    labels: np.ndarray
    name: str
    classes: tuple[str, ...]

    def __post_init__(self):
        x = np.ascontiguousarray(self.x, dtype=np.float32)
        labels = np.ascontiguousarray(self.labels, dtype=np.int32)
        if x.ndim != 4:
            raise ValueError(f"{self.name}: images must be (N, C, H, W), got shape {x.shape}")
        if labels.shape != (len(x),):
            raise ValueError(f"{self.name}: {len(x)} images but labels of shape {labels.shape}")
        if len(labels) and (labels.min() < 0 or labels.max() >= len(self.classes)):
            raise ValueError(f"{self.name}: labels must lie in [0, {len(self.classes)}), "
                             f"found [{labels.min()}, {labels.max()}]")
        object.__setattr__(self, "x", x)
        object.__setattr__(self, "labels", labels)
        object.__setattr__(self, "classes", tuple(str(c) for c in self.classes))

    def __len__(self) -> int:
        return len(self.x)

    @property
    def shape(self) -> tuple:
        """One image's shape, (C, H, W)."""
        return tuple(self.x.shape[1:])

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def __repr__(self) -> str:
        return f"Dataset({self.name!r}, {len(self)} images of {self.shape}, {self.num_classes} classes)"

    def batches(self, batch: int, shuffle: bool = True, seed: int = 0, drop_last: bool = True):
        """Yield ``(x, labels)`` mini-batches. A model's graph has a fixed batch size, so by default
        the last, smaller batch is dropped; ``shuffle`` draws one permutation from ``seed``."""
        if int(batch) < 1:
            raise ValueError(f"batch must be a positive integer, got {batch}")
        batch = int(batch)
        if drop_last and batch > len(self):
            raise ValueError(f"{self.name}: batch {batch} is larger than the {len(self)} images")
        order = np.random.default_rng(seed).permutation(len(self)) if shuffle else np.arange(len(self))
        stop = len(self) - len(self) % batch if drop_last else len(self)
        for start in range(0, stop, batch):
            idx = order[start:start + batch]
            yield self.x[idx], self.labels[idx]

    def num_batches(self, batch: int, drop_last: bool = True) -> int:
        return len(self) // batch if drop_last else -(-len(self) // batch)

    def subset(self, index, name: str | None = None) -> "Dataset":
        """The images at ``index`` (an index array or a slice), as a new data set."""
        return Dataset(self.x[index], self.labels[index], name or self.name, self.classes)

    def split(self, test_fraction: float = 0.2, seed: int = 0) -> tuple["Dataset", "Dataset"]:
        """(train, test): a shuffled split that keeps each class's share (stratified)."""
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
        rng = np.random.default_rng(seed)
        test = []
        for c in range(self.num_classes):
            members = rng.permutation(np.flatnonzero(self.labels == c))
            test.append(members[:int(round(len(members) * test_fraction))])
        test_idx = np.sort(np.concatenate(test)) if test else np.zeros(0, np.int64)
        train_idx = np.setdiff1d(np.arange(len(self)), test_idx)
        if not len(train_idx) or not len(test_idx):
            raise ValueError(f"{self.name}: a test fraction of {test_fraction} of {len(self)} images "
                             "leaves a part empty")
        return self.subset(train_idx, f"{self.name}/train"), self.subset(test_idx, f"{self.name}/test")

    def standardized(self, mean: float | None = None, std: float | None = None) -> "Dataset":
        """(x - mean) / std with one scalar each; by default this data set's own. Standardize a test
        set with its training set's numbers: ``test.standardized(train.x.mean(), train.x.std())``."""
        mean = float(self.x.mean()) if mean is None else float(mean)
        std = float(self.x.std()) if std is None else float(std)
        return Dataset((self.x - mean) / max(std, 1e-8), self.labels, self.name, self.classes)


def standardized(train: Dataset, test: Dataset) -> tuple[Dataset, Dataset]:
    """(train, test), both shifted and scaled by the training images' mean and standard deviation (one
    scalar each), so the test set is seen as the training set was: what ViTs and MLPs on raw pixels
    usually want (a CNN with batch normalization hardly minds)."""
    mean, std = float(train.x.mean()), float(train.x.std())
    return train.standardized(mean, std), test.standardized(mean, std)


# ---------------------------------------------------------------- synthetic
def synthetic(n: int, shape=(1, 8, 8), classes: int = 4, seed: int = 0, noise: float = 0.1) -> Dataset:
    """``n`` images where the class is *which region holds a bright blob*.

    The image is cut into a grid of ``rows x cols`` regions (the smallest near-square grid with at
    least ``classes`` cells: 2 x 2 for 4 classes, 3 x 4 for 10), numbered row by row. An image of
    class k has one Gaussian blob (peak 1, width a quarter of a region) centred at a random point
    inside region k, in every channel, plus Gaussian noise of standard deviation ``noise``.
    A small CNN learns it in a few dozen steps; the same ``seed`` gives the same images.
    """
    n, classes = int(n), int(classes)
    c, h, w = (int(s) for s in shape)
    if n < 1 or min(c, h, w) < 1:
        raise ValueError(f"synthetic: need n >= 1 and a positive (C, H, W), got n={n}, shape={shape}")
    rows = max(1, math.isqrt(classes))
    cols = -(-classes // rows)
    if classes < 2 or rows > h or cols > w:
        raise ValueError(f"synthetic: {classes} classes need a {rows}x{cols} grid of regions, "
                         f"which does not fit a {h}x{w} image (and classes must be >= 2)")
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    r, col = labels // cols, labels % cols
    cy = (r + rng.uniform(0.2, 0.8, n)) * h / rows  # the blob's centre, inside its region
    cx = (col + rng.uniform(0.2, 0.8, n)) * w / cols
    sigma = 0.25 * min(h / rows, w / cols) + 0.25
    yy, xx = np.meshgrid(np.arange(h) + 0.5, np.arange(w) + 0.5, indexing="ij")
    blob = np.exp(-((yy - cy[:, None, None]) ** 2 + (xx - cx[:, None, None]) ** 2) / (2 * sigma ** 2))
    x = np.repeat(blob[:, None], c, axis=1) + noise * rng.standard_normal((n, c, h, w))
    names = [f"r{k // cols}c{k % cols}" for k in range(classes)]
    return Dataset(x.astype(np.float32), labels, "synthetic", names)


# ---------------------------------------------------------------- scikit-learn's digits
def digits(seed: int = 0, test_fraction: float = 0.2, standardize: bool = False) -> tuple[Dataset, Dataset]:
    """scikit-learn's bundled 8x8 handwritten digits (1,797 images, shipped inside the package, no
    download), scaled from 0..16 to [0, 1]; returns a stratified (train, test) split. With
    ``standardize`` both are shifted and scaled by the training set's mean and standard deviation."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:
        raise ImportError('the digits data set comes with scikit-learn: pip install -e ".[digits]" '
                          "(or pip install scikit-learn)") from e
    d = load_digits()
    x = (d.images.astype(np.float32) / 16.0)[:, None]
    full = Dataset(x, d.target, "digits", [str(k) for k in range(10)])
    train, test = full.split(test_fraction, seed)
    return standardized(train, test) if standardize else (train, test)


# ---------------------------------------------------------------- MNIST (IDX files)
MNIST_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
               "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
MNIST_SOURCE = ("the four files of http://yann.lecun.com/exdb/mnist/ (or any mirror of them), "
                "gzipped or not")
IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC = 2051, 2049  # 0x00000803: ubyte, 3 dims; 0x00000801: ubyte, 1 dim


def mnist(path) -> tuple[Dataset, Dataset]:
    """MNIST from the IDX files in directory ``path`` (each may also be ``<name>.gz``): returns
    (train, test), images (N, 1, H, W) scaled to [0, 1]. Checks each file's magic number, that its
    size matches the sizes its header declares, and that images and labels agree in number."""
    expected = [f for pair in MNIST_FILES.values() for f in pair]
    files = {f: _find(path, f, (f, f + ".gz", f.replace("-idx", ".idx")), expected, "MNIST", MNIST_SOURCE)
             for f in expected}
    out = []
    for part, (img_name, lbl_name) in MNIST_FILES.items():
        images = _read_idx(files[img_name], IDX_IMAGES_MAGIC, 3)
        labels = _read_idx(files[lbl_name], IDX_LABELS_MAGIC, 1)
        if len(images) != len(labels):
            raise DataError(f"{files[img_name]} holds {len(images)} images but {files[lbl_name]} holds "
                            f"{len(labels)} labels: expected the same number")
        if labels.size and labels.max() > 9:
            raise DataError(f"{files[lbl_name]}: labels must be digits 0..9, found {labels.max()}")
        x = (images.astype(np.float32) / 255.0)[:, None]
        out.append(Dataset(x, labels, f"mnist/{part}", [str(k) for k in range(10)]))
    if out[0].shape != out[1].shape:
        raise DataError(f"MNIST train images are {out[0].shape[1:]} but test images are {out[1].shape[1:]}")
    return out[0], out[1]


def _read_idx(file: str, magic: int, ndim: int) -> np.ndarray:
    """An IDX file of unsigned bytes: magic (4 bytes, big-endian), ``ndim`` sizes (4 bytes each), data."""
    raw = _read_bytes(file)
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{file}: expected an IDX header of {header} bytes, found a file of {len(raw)} bytes")
    found = int.from_bytes(raw[:4], "big")
    if found != magic:
        raise DataError(f"{file}: expected the IDX magic number {magic} (0x{magic:08x}: unsigned bytes, "
                        f"{ndim} dimension{'s' * (ndim > 1)}), found {found} (0x{found:08x}): "
                        f"not this kind of IDX file, or corrupt")
    dims = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    size = header + math.prod(dims)
    if len(raw) != size:
        raise DataError(f"{file}: its header declares {' x '.join(map(str, dims))} values, so expected "
                        f"{size:,} bytes, found {len(raw):,} "
                        f"({'truncated' if len(raw) < size else 'extra bytes'})")
    return np.frombuffer(raw, np.uint8, offset=header).reshape(dims)


# ---------------------------------------------------------------- CIFAR-10 (binary batches)
CIFAR10_TRAIN = tuple(f"data_batch_{k}.bin" for k in range(1, 6))
CIFAR10_TEST = "test_batch.bin"
CIFAR10_RECORD_BYTES = 1 + 3 * 32 * 32  # one label byte, then 1024 red, 1024 green, 1024 blue bytes
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
CIFAR10_SOURCE = ("cifar-10-binary.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html, "
                  "extracted with tar xzf (it makes cifar-10-batches-bin/)")


def cifar10(path, records_per_file: int = 10_000) -> tuple[Dataset, Dataset]:
    """CIFAR-10 from its binary batches in directory ``path`` (or ``path/cifar-10-batches-bin``):
    returns (train, test), images (N, 3, 32, 32) scaled to [0, 1]. Each file must hold exactly
    ``records_per_file`` records of 3,073 bytes with labels 0..9."""
    path = str(path)
    nested = os.path.join(path, "cifar-10-batches-bin")
    if not os.path.exists(os.path.join(path, CIFAR10_TEST)) and os.path.isdir(nested):
        path = nested
    expected = list(CIFAR10_TRAIN) + [CIFAR10_TEST]
    files = [_find(path, f, (f,), expected, "CIFAR-10", CIFAR10_SOURCE) for f in expected]
    parts = [_read_cifar_batch(f, int(records_per_file)) for f in files]
    train = Dataset(np.concatenate([p[0] for p in parts[:-1]]), np.concatenate([p[1] for p in parts[:-1]]),
                    "cifar10/train", CIFAR10_CLASSES)
    return train, Dataset(parts[-1][0], parts[-1][1], "cifar10/test", CIFAR10_CLASSES)


def _read_cifar_batch(file: str, records: int) -> tuple[np.ndarray, np.ndarray]:
    raw = _read_bytes(file)
    size = records * CIFAR10_RECORD_BYTES
    if len(raw) != size:
        raise DataError(f"{file}: expected {records:,} records of {CIFAR10_RECORD_BYTES:,} bytes "
                        f"({size:,} bytes), found {len(raw):,} bytes "
                        f"({'truncated' if len(raw) < size else 'extra bytes'})")
    table = np.frombuffer(raw, np.uint8).reshape(records, CIFAR10_RECORD_BYTES)
    labels = table[:, 0]
    if labels.size and labels.max() > 9:
        bad = int(np.argmax(labels > 9))
        raise DataError(f"{file}: record {bad} has label {labels[bad]}, expected 0..9 "
                        "(a corrupt or shifted file)")
    x = table[:, 1:].reshape(records, 3, 32, 32).astype(np.float32) / 255.0
    return x, labels


# ---------------------------------------------------------------- files
def _find(path, name, candidates, expected, what, source) -> str:
    """The first of ``candidates`` in directory ``path``, or an error that says what to put there."""
    path = str(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{what}: no directory {path!r}. Expected it to hold {', '.join(expected)}: "
                                f"get {source}")
    for c in candidates:
        full = os.path.join(path, c)
        if os.path.isfile(full):
            return full
    raise FileNotFoundError(f"{what}: {name} not found in {path!r}. Expected {', '.join(expected)}: "
                            f"get {source}")


def _read_bytes(file: str) -> bytes:
    if not file.endswith(".gz"):
        with open(file, "rb") as f:
            return f.read()
    try:
        with gzip.open(file, "rb") as f:
            return f.read()
    except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
        raise DataError(f"{file}: expected a complete gzip file, found a corrupt or truncated one "
                        f"({e})") from e


LOADERS = ("synthetic", "digits", "mnist", "cifar10")

__all__ = ["CIFAR10_CLASSES", "DataError", "Dataset", "LOADERS", "cifar10", "digits", "mnist", "synthetic"]
