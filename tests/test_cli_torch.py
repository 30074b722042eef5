"""A PyTorch NET on the command line, beyond what tests/test_from_torch.py checks: the refusals made
before any work (no torch needed), and ``snlite train`` on a module from a file."""
import importlib.util
import textwrap

import pytest

from snlite import cli

MODEL_FILE = textwrap.dedent("""\
    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self, width=8, num_classes=4):
            super().__init__()
            self.conv = nn.Conv2d(1, width, 3, padding=1)
            self.fc = nn.Linear(width * 8 * 8, num_classes)

        def forward(self, x):
            return self.fc(torch.flatten(torch.relu(self.conv(x)), 1))
    """)


def run(argv, capsys):
    status = cli.main(argv)
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("argv, message", [
    (["plan", "torchvision:9lives"], "expected torchvision:NAME (e.g. torchvision:resnet18)"),
    (["plan", "no/such/file.py:Net"], "there is no file 'no/such/file.py'"),
    (["plan", "alexnet", "--input", "3x8x8"], "--input is for a PyTorch NET"),
    (["maxbatch", "alexnet", "--budget", "1GiB", "--input", "3x8x8", "--torch-args", "{}"],
     "--input and --torch-args are for a PyTorch NET"),
])
def test_a_malformed_pytorch_net_is_a_usage_error_before_any_work(argv, message, capsys):
    status, _, err = run(argv, capsys)
    assert status == 2 and message in err and err.count("\n") == 1


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is not installed: "
                    "pip install -e \".[torch]\"")
def test_train_a_module_from_a_file_on_the_data_s_images(tmp_path, capsys):
    path = tmp_path / "my_model.py"
    path.write_text(MODEL_FILE)
    status, out, err = run(["train", f"{path}:Net", "--data", "synthetic", "--epochs", "1", "--limit", "64",
                            "--device", "host"], capsys)
    assert status == 0, err
    assert "epoch 1/1: test accuracy" in out
    status, _, err = run(["train", f"{path}:Net", "--data", "digits", "--epochs", "1", "--limit", "64",
                          "--device", "host"], capsys)
    assert status == 1 and "has 4 classes but --data digits has 10" in err and '"num_classes": 10' in err
