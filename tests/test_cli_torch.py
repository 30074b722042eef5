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


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is not installed: "
                    "pip install -e \".[torch]\"")
def test_a_model_file_imports_the_modules_beside_it_as_python_would_run_it(tmp_path, capsys):
    """A ViT of one's own split over two files: its blocks beside it import (the file's folder first on
    sys.path while it loads, as ``python my_vit.py`` has it), and sys.path is as it was after."""
    import sys

    (tmp_path / "my_blocks.py").write_text(textwrap.dedent("""\
        from torch import nn


        class Block(nn.Module):
            def __init__(self, dim, heads):
                super().__init__()
                self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
                self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
                self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

            def forward(self, x):
                h = self.norm1(x)
                x = x + self.attn(h, h, h, need_weights=False)[0]
                return x + self.mlp(self.norm2(x))
        """))
    (tmp_path / "my_vit.py").write_text(textwrap.dedent("""\
        import torch
        from torch import nn

        from my_blocks import Block


        class ViT(nn.Module):
            def __init__(self, dim=8, num_classes=10):
                super().__init__()
                self.patch_embed = nn.Conv2d(1, dim, 2, stride=2)
                self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
                self.pos_embed = nn.Parameter(torch.randn(1, 17, dim) * 0.02)
                self.block, self.norm = Block(dim, 2), nn.LayerNorm(dim)
                self.head = nn.Linear(dim, num_classes)

            def forward(self, x):
                x = self.patch_embed(x).flatten(2).transpose(1, 2)
                x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1) + self.pos_embed
                return self.head(self.norm(self.block(x))[:, 0])
        """))
    path = list(sys.path)
    status, out, err = run(["train", f"{tmp_path / 'my_vit.py'}:ViT", "--data", "digits", "--epochs", "1",
                            "--limit", "64", "--device", "host", "--preset", "superneurons"], capsys)
    assert status == 0, err
    assert "epoch 1/1: test accuracy" in out and sys.path == path
