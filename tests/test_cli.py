"""The `snlite` command: demo, train, --save/--load, --help, and one-line errors (the limits and bad input
of the planning commands: tests/test_cli_limits.py)."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from snlite import cli
from snlite.train import Model

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = ["train", "lenet", "--data", "synthetic", "--device", "host", "--epochs", "1", "--limit", "128",
         "--batch", "16"]


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------- demo
def test_demo_shows_the_plan_the_savings_and_identical_training(capsys):
    code, out, err = run(capsys, "demo", "--steps", "30")
    assert code == 0, err
    assert "Scheduler for small_cnn" in out and "offload conv1" in out and "release conv1" in out
    peaks = [int(v.replace(",", "")) for v in re.findall(r"^(?:baseline|\+ [\w ]+?) +([0-9,]+) ", out, re.M)]
    assert len(peaks) == 5 and peaks == sorted(peaks, reverse=True) and peaks[-1] < peaks[0]
    assert "losses and weights bit-identical: True" in out
    for planned in re.findall(r"peak ([0-9,]+) bytes \(planned ([0-9,]+)\)", out):
        assert planned[0] == planned[1], "each run's peak must equal the planned peak"
    losses = [float(v) for v in re.findall(r"^step +\d+ +loss ([0-9.]+) \(baseline\)", out, re.M)]
    assert len(losses) == 7 and losses[-1] < 0.5 * losses[0]
    acc = re.search(r"test accuracy \d+% before training, (\d+)% after", out)
    assert acc and int(acc[1]) >= 90


def test_a_student_copys_stub_says_it_is_not_written_yet_and_how_to_grade_it(monkeypatch, capsys):
    def stub(**kwargs):
        raise NotImplementedError("Assignment 5: cost-aware recomputation")

    monkeypatch.setattr(cli.demo, "run", stub)
    code, out, err = run(capsys, "demo")
    assert code == 1 and err == ("snlite demo: error: not written yet: Assignment 5: cost-aware "
                                 "recomputation (the student copy's stub; python -m snlite.assignments "
                                 "grade 5 checks it)\n")


def test_demo_on_the_meta_device_shows_the_plan_only(capsys):
    code, out, _ = run(capsys, "demo", "--device", "meta")
    assert code == 0 and "Scheduler for small_cnn" in out and "holds no data" in out
    assert "step " not in out.split("holds no data")[1]


# ---------------------------------------------------------------- train
def test_train_one_short_epoch_on_synthetic_data(capsys):
    code, out, err = run(capsys, *TRAIN)
    assert code == 0, err
    bar = re.search(r"epoch 1/1 \[#{20}\] 8/8  loss ([0-9.]+)  acc [0-9.]+%  [0-9,]+ img/s  peak device "
                    r"memory [0-9.]+ MiB",
                    out)
    assert bar, out
    assert re.search(r"epoch 1/1: test accuracy [0-9.]+%", out)


def test_standardize_scales_by_the_images_trained_on(capsys):
    code, out, err = run(capsys, *TRAIN, "--standardize")
    assert code == 0, err
    train = cli.load_data("synthetic")[0].subset(slice(0, 128))  # --limit 128: after the limit
    assert f"standardized by their mean {train.x.mean():.4g} and std {train.x.std():.4g}, batch 16" in out
    assert "standardized" not in run(capsys, *TRAIN)[1]


def test_save_and_load_round_trip(tmp_path, capsys):
    file = tmp_path / "lenet.npz"
    code, out, err = run(capsys, *TRAIN, "--save", str(file))
    assert code == 0, err
    assert os.listdir(tmp_path) == ["lenet.npz"]  # the temporary file was renamed, nothing left behind
    saved = dict(np.load(file))
    graph = cli.build_model("lenet", 16, cli.load_data("synthetic")[0])
    model = Model(graph, device="host")
    assert cli.load_params(str(file), model) == len(saved)
    for name, value in model.params.items():
        assert np.array_equal(value, saved[name]), name
    code, out, err = run(capsys, *TRAIN, "--load", str(file))
    assert code == 0 and f"loaded {len(saved)} parameter tensors" in out


def test_load_reports_mismatches_in_one_line(tmp_path, capsys):
    run(capsys, *TRAIN, "--save", str(tmp_path / "ok.npz"))
    params = dict(np.load(tmp_path / "ok.npz"))
    params["ip2.weight"] = params["ip2.weight"][:3]
    del params["conv1.bias"]
    np.savez(tmp_path / "bad.npz", **params)
    code, out, err = run(capsys, *TRAIN, "--load", str(tmp_path / "bad.npz"))
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "does not fit this network" in err and "conv1.bias" in err \
        and "ip2.weight: expected (4, 500)" in err
    (tmp_path / "junk.npz").write_bytes(b"not a zip file")
    code, _, err = run(capsys, *TRAIN, "--load", str(tmp_path / "junk.npz"))
    assert code == 1 and "not a readable .npz" in err
    code, _, err = run(capsys, *TRAIN, "--load", str(tmp_path / "none.npz"))
    assert code == 1 and "no such file" in err


def test_save_into_a_missing_folder_fails_cleanly(tmp_path, capsys):
    code, out, err = run(capsys, *TRAIN, "--save", str(tmp_path / "no" / "such" / "dir.npz"))
    assert code == 1 and "its folder does not exist" in err and "epoch" not in out


def test_a_failed_save_leaves_no_file(tmp_path, monkeypatch):
    (tmp_path / "old.npz").write_bytes(b"the previous file")

    def savez_that_dies(f, **params):
        f.write(b"half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.np, "savez", savez_that_dies)
    with pytest.raises(KeyboardInterrupt):
        cli.save_params(str(tmp_path / "old.npz"), {"w": np.zeros(3)})
    assert os.listdir(tmp_path) == ["old.npz"] and (tmp_path / "old.npz").read_bytes() == b"the previous file"


def test_digits_reaches_good_accuracy_quickly(capsys):
    pytest.importorskip("sklearn", reason="scikit-learn is not installed (pip install -e \".[digits]\")")
    code, out, err = run(capsys, "train", "lenet", "--data", "digits", "--device", "host", "--epochs", "2")
    assert code == 0, err
    accs = [float(a) for a in re.findall(r"test accuracy ([0-9.]+)%", out)]
    assert len(accs) == 2 and accs[-1] > 80  # the default 6 epochs reach 96-99%


# ---------------------------------------------------------------- help and errors
@pytest.mark.parametrize("argv", [["--help"], ["demo", "--help"], ["train", "--help"]])
def test_help(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 0 and "usage: snlite" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [
    ["demo", "--steps", "0"], ["demo", "--device", "tpu"], ["train", "lenet", "--batch", "-3"],
    ["train", "lenet", "--lr", "0"], ["train", "lenet", "--momentum", "1"],
    ["train", "lenet", "--epochs", "x"], ["train"], [],
])
def test_bad_flags_are_argparse_errors(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2 and "error:" in capsys.readouterr().err


def test_a_misspelled_flag_is_refused_in_its_commands_usage_with_the_nearest_flag(capsys):
    """argparse refused it in the top-level usage ("usage: snlite [-h] ... COMMAND") and guessed nothing."""
    with pytest.raises(SystemExit) as e:
        cli.main(["plan", "lenet", "--offlaod", "--recompute=speed", "--cahce"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("usage: snlite plan ")
    assert err.rstrip().endswith("snlite plan: error: unrecognized arguments: --offlaod --cahce (did you "
                                 "mean --offload, --cache?)"), err
    with pytest.raises(SystemExit):
        cli.main(["plan", "lenet", "stray"])
    assert capsys.readouterr().err.rstrip().endswith("snlite plan: error: unrecognized arguments: stray")
    with pytest.raises(SystemExit):
        cli.main(["plan", "lenet", "--traceback"])
    assert capsys.readouterr().err.rstrip().endswith(
        "unrecognized arguments: --traceback (--traceback goes before the command: snlite --traceback "
        "plan ...)")
    assert cli.main(["plan", "lenet", "--batch", "2", "--preset", "SuperNeurons", "--json", "-"]) == 0
    assert "schedule=H200" in capsys.readouterr().out, "a preset in any case, as --schedule h200 is"


@pytest.mark.parametrize("argv,message", [
    (["--data", "mnist:/no/such/dir"],
     "no directory '/no/such/dir'. Expected it to hold train-images-idx3-ubyte"),
    (["--data", "cifar10:/no/such/dir"], "data_batch_1.bin"),
    (["--data", "synthetic", "--batch", "4096"], "larger than the 2048 training images"),
    (["--device", "meta"], "cannot train"),
])
def test_bad_values_are_one_line_errors(argv, message, capsys):
    code, _, err = run(capsys, "train", "lenet", "--device", "host", *argv)
    assert code == 1 and len(err.strip().splitlines()) == 1 and message in err, err


def test_unknown_net_and_wrong_image_size(capsys):
    code, _, err = run(capsys, "train", "lenett", "--data", "synthetic")
    assert code == 2 and "unknown model 'lenett'" in err
    code, _, err = run(capsys, "train", "cifar_resnet20", "--data", "synthetic")
    assert code == 1 and "takes images of (3, 32, 32)" in err


def test_the_console_script_prints_no_traceback():
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "snlite.cli", "train", "lenet", "--data", "mnist:/no/such/dir"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert p.stderr.startswith("snlite train: error: MNIST: no directory")


def test_progress_bar_redraws_on_a_terminal():
    class Tty:
        text = ""

        def isatty(self):
            return True

        def write(self, s):
            self.text += s

        def flush(self):
            pass

    t = Tty()
    bar = cli.Progress("epoch 1/1", 2, stream=t)
    bar.update(1, "loss 1.0")
    bar.update(2, "loss 0.5")
    bar.close()
    assert t.text.startswith("\repoch 1/1 [##########..........] 1/2  loss 1.0") and t.text.endswith("\n")
    assert t.text.count("\r") == 3


def test_demo_needs_neither_scikit_learn_nor_a_gpu():
    code = ("import sys; sys.modules['sklearn'] = None\n"
            "from snlite.cli import main\n"
            "sys.exit(main(['demo', '--steps', '5']))")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "step   5  loss" in p.stdout


def test_streams_needs_a_cuda_device(capsys):
    code, _, err = run(capsys, "train", "lenet", "--data", "synthetic", "--limit", "16", "--batch", "8",
                       "--epochs", "1", "--device", "host", "--streams", "x.png")
    assert code != 0 and "--streams" in err and "needs --device cuda" in err and "Traceback" not in err


# ---------------------------------------------------------------- never silent
def _saved(tmp_path, capsys):
    file = tmp_path / "ok.npz"
    if not file.exists():
        code, _, err = run(capsys, *TRAIN, "--save", str(file))
        assert code == 0, err
    return dict(np.load(file))


def test_load_says_what_is_wrong_with_a_broken_file(tmp_path, capsys):
    """Empty, truncated, a .npy, a folder: one line each (they were BadZipFile, EOFError, TypeError
    tracebacks), exit status 1."""
    good = tmp_path / "good.npz"
    np.savez(good, **_saved(tmp_path, capsys))
    data = good.read_bytes()
    (tmp_path / "empty.npz").write_bytes(b"")
    (tmp_path / "truncated.npz").write_bytes(data[:len(data) // 2])
    (tmp_path / "one_byte.npz").write_bytes(b"x")
    np.save(tmp_path / "weights.npy", np.zeros(3, np.float32))
    np.savez(tmp_path / "objects.npz", conv1=np.array([{"w": 1}], dtype=object))  # intact, but pickled
    for name, message in [("empty.npz", "the file is empty"), ("truncated.npz", "truncated or damaged"),
                          ("one_byte.npz", "not a zip archive"), ("weights.npy", "it is a .npy file"),
                          (".", "cannot read it"), ("objects.npz", "it holds Python objects")]:
        code, _, err = run(capsys, *TRAIN, "--load", str(tmp_path / name))
        assert code == 1 and len(err.strip().splitlines()) == 1 and message in err, (name, err)
        assert "Traceback" not in err


def test_load_refuses_weights_that_are_not_finite(tmp_path, capsys):
    """A NaN-filled .npz used to train with exit status 0."""
    params = _saved(tmp_path, capsys)
    params["conv2.bias"][3] = np.nan
    np.savez(tmp_path / "nan.npz", **params)
    code, out, err = run(capsys, *TRAIN, "--load", str(tmp_path / "nan.npz"))
    assert code == 1 and "epoch" not in out
    assert "conv2.bias is not finite (1 NaN of 50 values (the first at (3,): nan)); refusing to train " \
           "from it" in err


def test_load_refuses_another_dtype_naming_the_tensor_and_the_fix(tmp_path, capsys):
    """A float64, int32 or bool file was cast to float32 without a word."""
    params = _saved(tmp_path, capsys)
    for dtype in (np.float64, np.int32, bool):
        np.savez(tmp_path / "cast.npz", **{**params, "ip1.bias": params["ip1.bias"].astype(dtype)})
        code, out, err = run(capsys, *TRAIN, "--load", str(tmp_path / "cast.npz"))
        assert code == 1 and "epoch" not in out and len(err.strip().splitlines()) == 1, err
        assert (f"--load {tmp_path / 'cast.npz'}: ip1.bias has dtype {np.dtype(dtype)}, but parameters are "
                "float32: convert it first, value.astype(np.float32); refusing to train from it") in err, err


def test_load_refuses_a_negative_batchnorm_variance(tmp_path):
    """It was loaded, and predict then gave NaN."""
    from snlite.graph import Graph

    g = Graph(input_shape=(2, 1, 4, 4), num_classes=2)
    g.softmax_loss(g.linear(g.flatten(g.batchnorm(g.conv2d(g.input(), 2, 3, padding=1, name="c1"),
                                                  name="bn")), 2))
    model = Model(g, device="host")
    before = model.params
    bad = {**before, "bn.running_var": np.array([1.0, -1.0], np.float32)}
    np.savez(tmp_path / "bad.npz", **bad)
    with pytest.raises(cli.CliError, match=r"bn.running_var is a BatchNorm variance, which cannot be "
                                           r"negative: 1 of 2 values are \(the first at \(1,\): -1.0\); "
                                           r"refusing to train from it"):
        cli.load_params(str(tmp_path / "bad.npz"), model)
    for name, value in model.params.items():
        np.testing.assert_array_equal(value, before[name])


def test_save_never_writes_weights_that_are_not_finite(tmp_path):
    with pytest.raises(cli.CliError,
                       match=r"--save .*: w is not finite \(1 \+inf of 3 values.*nothing was written"):
        cli.save_params(str(tmp_path / "w.npz"),
                        {"v": np.zeros(2, np.float32), "w": np.array([0, np.inf, 1])})
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_saved_file_mode_is_the_umasks(tmp_path, umask):
    """mkstemp made every saved file 0600; a saved file is an ordinary new file."""
    old = os.umask(umask)
    try:
        cli.save_params(str(tmp_path / "w.npz"), {"w": np.zeros(3, np.float32)})
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "w.npz").st_mode & 0o777 == 0o666 & ~umask
    assert os.listdir(tmp_path) == ["w.npz"]


def test_a_diverging_run_stops_naming_the_epoch_the_step_and_the_layer(tmp_path, capsys):
    code, out, err = run(capsys, *TRAIN, "--lr", "1e30", "--save", str(tmp_path / "w.npz"))
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert re.match(r"snlite train: error: epoch 1, step \d+: training iteration \d+: the loss is nan; the "
                    r"first non-finite values appear in layer '\w+' \(\w+, forward step \d+\)", err), err
    assert not os.listdir(tmp_path)


def test_anomaly_flag_trains_a_finite_run_as_usual(capsys):
    code, out, err = run(capsys, *TRAIN, "--anomaly")
    assert code == 0, err
    assert re.search(r"epoch 1/1: test accuracy", out)


@pytest.mark.parametrize("argv,message", [
    (["train", "lenet", "--seed", "-1"],
     r"argument --seed: expected an integer in \[0, 4294967295\], got '-1'"),
    (["demo", "--seed", "2.5"], r"argument --seed: expected an integer"),
    (["train", "lenet", "--lr", "-0.1"], r"argument --lr: expected a learning rate > 0, got -0.1"),
    # finite as a Python float, not in float32 (the update's precision): inf, 0 and 1 there
    (["train", "lenet", "--lr", "1e39"], r"argument --lr: expected a learning rate > 0; the value must be a "
                                         r"finite number > 0 in float32, .*got 1e\+39, which float32 "
                                         r"rounds to inf"),
    (["train", "lenet", "--lr", "1e-50"],
     r"argument --lr: .* in float32, .*got 1e-50, which float32 rounds to 0.0"),
    (["train", "lenet", "--momentum", "0.99999999"], r"argument --momentum: .*in \[0, 1\) in float32, "
                                                     r".*rounds to 1.0"),
    (["train", "lenet", "--weight-decay", "1e39"],
     r"argument --weight-decay: .* in float32, .*rounds to inf"),
    (TRAIN + ["--momentum", "1e-50"], r"argument --momentum: .* in float32, .*got 1e-50, which float32 "
                                      r"rounds to 0.0: .* \(0 only if it is 0\)"),
    (TRAIN + ["--weight-decay", "1e-50"], r"argument --weight-decay: .* in float32, .*rounds to 0.0"),
    (["train", "lenet", "--budget", "-5GiB"], r"argument --budget: a size must be positive, got '-5GiB'"),
    (["train", "lenet", "--budget", "1.5"],
     r"argument --budget: '1.5' is not a size in whole bytes \(1.5 B\)"),
    (["train", "lenet", "--budget", "1000"], r"argument --budget: a budget must be at least 1,024 bytes"),
    (["train", "lenet", "--budget", "1.0000001GiB"],
     r"argument --budget: '1.0000001GiB' is 1,073,741,931.3741824 bytes, not a whole number of bytes; give "
     r"whole bytes, e.g. 1073741931 or 1073741932"),
    (["plan", "lenet", "--host-budget", "2.1GiB"],
     r"argument --host-budget: '2.1GiB' is 2,254,857,830.4 bytes"),
    (["plan", "lenet", "--host-budget", "-5MiB"],
     r"argument --host-budget: a size must be positive, got '-5MiB'"),
    (["compare", "lenet", "--host-budget", "10"],
     r"argument --host-budget: a host budget must be at least 256 bytes \(one slot of the pinned slab\), got "
     r"'10' \(10 bytes\)"),
    (["maxbatch", "lenet", "--host-budget", "255"],
     r"argument --host-budget: a host budget must be at least 256"),
    (["maxdepth", "--budget", "0.3KiB"], r"argument --budget: '0.3KiB' is 307.2 bytes, not a whole number"),
    (["train", "lenet", "--batch", "-3"], r"argument --batch: expected a positive integer, got -3"),
    # a batch no grid launches (plan ran without end at 1e20, one launch per 65,535 images)
    (["plan", "lenet", "--batch", "99999999999999999999"],
     r"argument --batch: expected a batch of at most 1,048,576 images, got 99,999,999,999,999,999,999"),
    (["maxbatch", "lenet", "--max-batch", "2000000"],
     r"argument --max-batch: expected a batch of at most 1,048,576"),
    # the demo makes its images up front: a billion steps asked for 60 GiB and ended in a traceback
    (["demo", "--steps", "1000000000"],
     r"argument --steps: expected at most 2,000, got 1,000,000,000: the demo makes its images up front"),
    (["bench", "--units", "20"], r"argument --units: no bottleneck ResNet of 20 residual units"),
])
def test_bad_numbers_are_usage_errors_that_name_the_flag(argv, message, capsys):
    """Exit status 2, one line naming the flag (--budget -5GiB was 'expected one argument', --seed -1
    an anonymous 'expected non-negative integer', --budget 1.5 an arena 'of 0 bytes' with status 1)."""
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and re.search(message, err), err


def test_a_closed_pipe_ends_quietly():
    """snlite plan ... --json | head: no 'Broken pipe' error, exit status 141 (128 + SIGPIPE)."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.Popen([sys.executable, "-m", "snlite.cli", "plan", "resnet50", "--batch", "2", "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert p.stdout.readline().strip() == b"{"
    p.stdout.close()  # the reader goes away with most of the JSON unread
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141 and err == "", err


def test_version_says_which_checkout_runs(capsys):
    """An editable install runs its own checkout's code from anywhere, a clone's directory too: the
    version line names the folder, so a contributor can tell."""
    from snlite.version import __version__

    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and out == f"snlite {__version__} (from {REPO})\n", out
