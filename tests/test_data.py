"""snlite.data: the Dataset, the synthetic task, digits, and the MNIST / CIFAR-10 readers on small
files written here (valid, truncated, wrong magic, corrupt, missing)."""
import gzip
import struct
import sys

import numpy as np
import pytest

from snlite import data
from snlite.data import DataError, Dataset


# ---------------------------------------------------------------- Dataset
def small(n=10, classes=3):
    x = np.arange(n * 4, dtype=np.float32).reshape(n, 1, 2, 2)
    return Dataset(x, np.arange(n) % classes, "small", [str(c) for c in range(classes)])


def test_dataset_checks_its_arrays():
    with pytest.raises(ValueError, match="labels"):
        Dataset(np.zeros((3, 1, 2, 2)), np.zeros(4), "bad", ["a", "b"])
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        Dataset(np.zeros((3, 1, 2, 2)), [0, 1, 2], "bad", ["a", "b"])
    with pytest.raises(ValueError, match="N, C, H, W"):
        Dataset(np.zeros((3, 4)), [0, 1, 0], "bad", ["a", "b"])
    d = small()
    assert d.x.dtype == np.float32 and d.labels.dtype == np.int32 and d.shape == (1, 2, 2) \
        and d.num_classes == 3


def test_batches_cover_each_image_once_and_drop_the_last():
    d = small(10)
    got = list(d.batches(3, shuffle=True, seed=1))
    assert len(got) == 3 == d.num_batches(3) and all(x.shape == (3, 1, 2, 2) for x, _ in got)
    firsts = np.concatenate([x[:, 0, 0, 0] for x, _ in got]) / 4
    assert len(set(firsts)) == 9
    assert [len(y) for _, y in d.batches(3, shuffle=False, drop_last=False)] == [3, 3, 3, 1]
    again = list(d.batches(3, shuffle=True, seed=1))
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(got, again))
    for x, y in got:  # images keep their labels
        assert np.array_equal((x[:, 0, 0, 0] / 4).astype(int) % 3, y)
    with pytest.raises(ValueError, match="larger than"):
        next(d.batches(11))


def test_split_is_stratified_and_disjoint():
    d = small(30, classes=3)
    train, test = d.split(0.2, seed=0)
    assert len(train) + len(test) == 30 and np.bincount(test.labels).tolist() == [2, 2, 2]
    assert not set(train.x[:, 0, 0, 0]) & set(test.x[:, 0, 0, 0])
    with pytest.raises(ValueError):
        d.split(1.5)


# ---------------------------------------------------------------- synthetic
def test_standardized_sees_the_test_set_as_the_training_set():
    train, test = data.synthetic(64, seed=0), data.synthetic(32, seed=1)
    strain, stest = data.standardized(train, test)
    assert abs(strain.x.mean()) < 1e-5 and abs(strain.x.std() - 1) < 1e-5
    mean, std = train.x.mean(), train.x.std()  # the training set's numbers, not the test set's own
    np.testing.assert_allclose(stest.x, (test.x - mean) / std, rtol=1e-6, atol=1e-6)
    assert abs(stest.x.mean()) > 1e-3 and np.array_equal(stest.labels, test.labels)


def test_synthetic_is_deterministic_and_balanced():
    a, b, c = data.synthetic(200, seed=3), data.synthetic(200, seed=3), data.synthetic(200, seed=4)
    assert np.array_equal(a.x, b.x) and np.array_equal(a.labels, b.labels)
    assert not np.array_equal(a.x, c.x)
    assert a.x.shape == (200, 1, 8, 8) and a.num_classes == 4 and set(a.labels.tolist()) == {0, 1, 2, 3}


@pytest.mark.parametrize("shape,classes,grid", [((1, 8, 8), 4, (2, 2)), ((3, 9, 12), 10, (3, 4))])
def test_synthetic_blob_sits_in_the_labelled_region(shape, classes, grid):
    d = data.synthetic(100, shape, classes, seed=0, noise=0.0)
    rows, cols = grid
    _, h, w = shape
    for x, label in zip(d.x, d.labels):
        y_, x_ = np.unravel_index(np.argmax(x[0]), x[0].shape)
        assert (int(y_ * rows // h), int(x_ * cols // w)) == divmod(int(label), cols)
        assert np.array_equal(x[0], x[-1])  # the same blob in every channel


def test_synthetic_rejects_too_many_classes():
    with pytest.raises(ValueError, match="grid"):
        data.synthetic(10, (1, 2, 2), classes=10)


# ---------------------------------------------------------------- digits
def test_digits():
    pytest.importorskip("sklearn", reason="scikit-learn is not installed (pip install -e \".[digits]\")")
    train, test = data.digits(seed=0)
    assert len(train) + len(test) == 1797 and train.shape == (1, 8, 8) and train.num_classes == 10
    assert 0.0 <= train.x.min() and train.x.max() <= 1.0
    assert abs(len(test) / 1797 - 0.2) < 0.01
    strain, stest = data.digits(seed=0, standardize=True)
    assert abs(strain.x.mean()) < 1e-4 and abs(strain.x.std() - 1) < 1e-4
    assert np.array_equal(stest.labels, test.labels)


def test_digits_without_scikit_learn_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)  # makes the import fail
    with pytest.raises(ImportError, match=r'pip install -e "\.\[digits\]"'):
        data.digits()


# ---------------------------------------------------------------- MNIST
def idx_bytes(array, magic):
    return struct.pack(">I", magic) + b"".join(struct.pack(">I", s) for s in array.shape) + array.tobytes()


def write_mnist(folder, n_train=5, n_test=3, gz=False, hw=(28, 28)):
    rng = np.random.default_rng(0)
    folder.mkdir(exist_ok=True)
    out = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, (n,) + hw, dtype=np.uint8)
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        for kind, arr, magic in (("images-idx3", images, 2051), ("labels-idx1", labels, 2049)):
            name = f"{prefix}-{kind}-ubyte"
            raw = idx_bytes(arr, magic)
            if gz:
                (folder / (name + ".gz")).write_bytes(gzip.compress(raw))
            else:
                (folder / name).write_bytes(raw)
        out[prefix] = (images, labels)
    return out


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_reads_valid_files(tmp_path, gz):
    written = write_mnist(tmp_path / "mnist", gz=gz)
    train, test = data.mnist(tmp_path / "mnist")
    assert train.x.shape == (5, 1, 28, 28) and test.x.shape == (3, 1, 28, 28)
    assert np.array_equal(train.labels, written["train"][1])
    assert np.allclose(train.x[:, 0] * 255, written["train"][0])


def test_mnist_truncated_file(tmp_path):
    write_mnist(tmp_path)
    f = tmp_path / "train-images-idx3-ubyte"
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(DataError,
                       match=r"train-images-idx3-ubyte.*expected 3,936 bytes, found 3,836 \(truncated\)"):
        data.mnist(tmp_path)


def test_mnist_wrong_magic(tmp_path):
    write_mnist(tmp_path)
    f = tmp_path / "t10k-labels-idx1-ubyte"
    f.write_bytes(struct.pack(">I", 2051) + f.read_bytes()[4:])  # an images magic on a labels file
    with pytest.raises(DataError,
                       match=r"t10k-labels-idx1-ubyte: expected the IDX magic number 2049.*found 2051"):
        data.mnist(tmp_path)


def test_mnist_counts_must_agree(tmp_path):
    write_mnist(tmp_path)
    labels = np.zeros(4, np.uint8)
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(idx_bytes(labels, 2049))
    with pytest.raises(DataError, match="5 images but .* 4 labels"):
        data.mnist(tmp_path)


def test_mnist_corrupt_gzip(tmp_path):
    write_mnist(tmp_path, gz=True)
    f = tmp_path / "train-images-idx3-ubyte.gz"
    f.write_bytes(f.read_bytes()[:30])
    with pytest.raises(DataError, match="train-images-idx3-ubyte.gz: expected a complete gzip file"):
        data.mnist(tmp_path)


def test_mnist_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="no directory .*train-images-idx3-ubyte.*lecun"):
        data.mnist(tmp_path / "nowhere")
    write_mnist(tmp_path)
    (tmp_path / "t10k-images-idx3-ubyte").unlink()
    with pytest.raises(FileNotFoundError, match="t10k-images-idx3-ubyte not found in"):
        data.mnist(tmp_path)


# ---------------------------------------------------------------- CIFAR-10
def write_cifar(folder, records=3):
    rng = np.random.default_rng(1)
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"data_batch_{k}.bin" for k in range(1, 6)] + ["test_batch.bin"]
    tables = {}
    for name in names:
        table = rng.integers(0, 256, (records, 3073), dtype=np.uint8)
        table[:, 0] = rng.integers(0, 10, records)
        (folder / name).write_bytes(table.tobytes())
        tables[name] = table
    return tables


def test_cifar10_reads_valid_files(tmp_path):
    tables = write_cifar(tmp_path / "cifar-10-batches-bin")
    train, test = data.cifar10(tmp_path, records_per_file=3)  # finds the folder tar makes
    assert train.x.shape == (15, 3, 32, 32) and test.x.shape == (3, 3, 32, 32) \
        and train.classes[0] == "airplane"
    t = tables["data_batch_2.bin"]
    assert np.array_equal(train.labels[3:6], t[:, 0])
    assert np.allclose(train.x[3, 1] * 255, t[0, 1025:2049].reshape(32, 32))  # green plane of record 0


def test_cifar10_truncated_and_corrupt(tmp_path):
    write_cifar(tmp_path)
    f = tmp_path / "data_batch_3.bin"
    f.write_bytes(f.read_bytes()[:-7])
    with pytest.raises(DataError, match=r"data_batch_3.bin: expected 3 records of 3,073 bytes \(9,219 "
                                        r"bytes\), found 9,212 bytes \(truncated\)"):
        data.cifar10(tmp_path, records_per_file=3)
    write_cifar(tmp_path)
    bad = bytearray((tmp_path / "test_batch.bin").read_bytes())
    bad[3073] = 200  # record 1's label
    (tmp_path / "test_batch.bin").write_bytes(bytes(bad))
    with pytest.raises(DataError, match="test_batch.bin: record 1 has label 200"):
        data.cifar10(tmp_path, records_per_file=3)
    with pytest.raises(DataError, match="expected 10,000 records"):  # the default: full-size files
        data.cifar10(tmp_path)


def test_cifar10_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="data_batch_1.bin not found .*cifar-10-binary.tar.gz"):
        data.cifar10(tmp_path)
