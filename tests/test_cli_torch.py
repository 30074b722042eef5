"""A PyTorch NET on the command line: the refusals made before any work (no torch needed), a torchvision
model and a module from a file planned as a zoo model is, with their arguments and input size, and
``snlite train`` on a module from a file. What the importer computes is tests/test_from_torch.py's."""
import importlib.util
import json
import re
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


needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="PyTorch is not installed: pip install -e \".[torch]\"")
needs_torchvision = pytest.mark.skipif(importlib.util.find_spec("torch") is None
                                       or importlib.util.find_spec("torchvision") is None,
                                       reason="torchvision is not installed: pip install -e \".[torch]\"")


def run(argv, capsys):
    status = cli.main(argv)
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("argv, message", [
    (["plan", "torchvision:9lives"], "expected torchvision:NAME (e.g. torchvision:resnet18)"),
    (["plan", "no/such/file.py:Net"], "there is no file 'no/such/file.py'"),
    (["plan", "alexnet", "--input", "3x8x8"], "--input is for a PyTorch NET"),
    (["plan", "my_net.py"], "'my_net.py': a NET from a file names what in it too: path/to/file.py:NAME"),
    (["compare", "torchvision"], "or torchvision:NAME (e.g. torchvision:resnet18)"),
    (["maxbatch", "alexnet", "--budget", "1GiB", "--input", "3x8x8", "--torch-args", "{}"],
     "--input and --torch-args are for a PyTorch NET"),
])
def test_a_malformed_pytorch_net_is_a_usage_error_before_any_work(argv, message, capsys):
    status, _, err = run(argv, capsys)
    assert status == 2 and message in err and err.count("\n") == 1


@needs_torch
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


@needs_torch
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


@needs_torchvision
def test_plan_takes_a_torchvision_model_and_prints_what_a_zoo_model_prints(capsys):
    status, out, err = run(["plan", "torchvision:resnet18", "--batch", "32"], capsys)
    assert status == 0, err
    assert out.startswith("torchvision:resnet18, batch 32: 71 layers, 11,689,512 parameters,")
    _, zoo, _ = run(["plan", "resnet50", "--batch", "32"], capsys)

    def sections(text, net):  # each unindented line up to its first number or parenthesis
        return [re.split(r"[\d(]", line.replace(net, "NET"))[0].rstrip() for line in text.splitlines()
                if line and not line.startswith(" ")]
    assert sections(out, "torchvision:resnet18") == sections(zoo, "resnet50")


NET_FILE = '''
import torch


class Tiny(torch.nn.Module):
    def __init__(self, width=4, classes=3):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, width, 3, padding=1)
        self.fc = torch.nn.Linear(width * 4 * 4, classes)

    def forward(self, x):
        return self.fc(torch.flatten(torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 2), 1))
'''


@needs_torchvision
def test_a_class_in_a_file_with_its_arguments_and_input(capsys, tmp_path):
    path = tmp_path / "tiny.py"
    path.write_text(NET_FILE)
    status, out, err = run(["compare", f"{path}:Tiny", "--input", "1x8x8", "--batch", "4",
                            "--torch-args", '{"width": 6, "classes": 5}'], capsys)
    assert status == 0, err
    assert f"{path}:Tiny" in out
    for command in ("compare", "plan", "maxbatch"):  # the JSON says what the numbers are of
        argv = [command, f"{path}:Tiny", "--input", "1x8x8", "--torch-args", '{"width": 6, "classes": 5}',
                "--json", "-"] + (["--budget", "1MiB", "--max-batch", "8"] if command == "maxbatch" else [])
        status, out, err = run(argv, capsys)
        assert status == 0, err
        data = json.loads(out)
        assert (data["net"], data["input"], data["torch_args"]) == (f"{path}:Tiny", [1, 8, 8],
                                                                   {"width": 6, "classes": 5}), command
    # 6 * (1*3*3 + 1) + 5 * (6*4*4 + 1) parameters
    from snlite.cli_common import builder

    g = builder(f"{path}:Tiny", (1, 8, 8), {"width": 6, "classes": 5})(4)
    assert g.param_count() == 6 * 10 + 5 * 97 and g.input_shape == (4, 1, 8, 8) and g.num_classes == 5
    # a name that names nothing is a usage error (2), as a name the zoo lacks is; a failing constructor is 1
    for argv, words, want in [
            ((f"{path}:Nope",), "defines no 'Nope'; it defines Tiny", 2),
            (("torchvision:resnet9",), "torchvision has no model 'resnet9'; did you mean", 2),
            ((f"{path}:Tiny", "--torch-args", '{"depth": 2}'), "Tiny(depth=2) failed", 1),
            ((f"{path}:Tiny", "--torch-args", '{"width": -1}'),  # raised inside the constructor
             "Tiny(width=-1) failed: RuntimeError: Trying to create tensor with negative", 1),
            ((f"{path}:Tiny", "--torch-args", "[1]"), "expected a JSON object", 2)]:
        try:
            status, out, err = run(["plan", *argv], capsys)
        except SystemExit as e:  # argparse refuses a malformed flag
            status, err = e.code, capsys.readouterr().err
        assert status == want and words in err, (status, err)


@needs_torch
def test_a_model_on_vectors_takes_its_features_as_input(tmp_path, capsys):
    """An MLP on (N, 784) could not be imported: the input had to be (C, H, W)."""
    path = tmp_path / "mlp.py"
    path.write_text("from torch import nn\n\n\nclass MLP(nn.Sequential):\n    def __init__(self):\n"
                    "        super().__init__(nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10))\n")
    status, out, err = run(["plan", f"{path}:MLP", "--input", "784", "--batch", "16"], capsys)
    assert status == 0 and out.startswith(f"{path}:MLP, batch 16: 5 layers, 50,890 parameters"), err
    with pytest.raises(SystemExit):
        run(["plan", f"{path}:MLP", "--input", "28x28"], capsys)
    assert "expected CxHxW of positive integers (3x224x224), or the features" in capsys.readouterr().err


@needs_torch
def test_maxbatch_starts_at_2_where_a_batch_of_1_is_no_valid_input(tmp_path, capsys):
    """A BatchNorm after a global pooling has one value per channel at batch 1, which training refuses
    (as PyTorch does): maxbatch failed on its first probe, a batch the user never asked for."""
    path = tmp_path / "pooled.py"
    path.write_text("from torch import nn\n\n\nclass Pooled(nn.Sequential):\n    def __init__(self):\n"
                    "        super().__init__(nn.Conv2d(3, 8, 3), nn.AdaptiveAvgPool2d(1),\n"
                    "                         nn.BatchNorm2d(8), nn.Flatten(), nn.Linear(8, 4))\n")
    net = [f"{path}:Pooled", "--input", "3x8x8"]
    status, out, err = run(["plan", *net, "--batch", "1"], capsys)
    assert status == 1 and "training needs more than 1 value per channel (N*H*W), got input (1, 8, 1, 1), " \
        "as PyTorch's BatchNorm2d does: a batch of at least 2" in err, err
    status, out, err = run(["maxbatch", *net, "--budget", "1MiB", "--max-batch", "8", "--json", "-"], capsys)
    data = json.loads(out)
    assert status == 0 and data["smallest_batch"] == 2, err
    assert all(r["batch"] is not None and r["batch"] >= 2 for r in data["rows"]), data["rows"]
    status, out, err = run(["maxbatch", *net, "--budget", "1MiB", "--max-batch", "8"], capsys)
    assert status == 0 and "the search starts at batch 2: a batch of 1 is no valid input here (batchnorm" \
        in out
    status, out, err = run(["maxbatch", net[0], "--input", "3x2x2", "--budget", "1MiB"], capsys)
    assert status == 1 and "(1, 3, 2, 2)" in err, "a net that builds at no batch fails on batch 1's error"


@needs_torch
def test_the_command_compare_and_plan_hand_on_rebuilds_the_same_module(tmp_path, capsys):
    """compare's "see why with snlite plan NET ..." left out --input and --torch-args, so the command it
    gave failed on another input (or built another network), and did not quote the path."""
    import shlex

    path = tmp_path / "my nets.py"
    path.write_text(NET_FILE)
    net = [f"{path}:Tiny", "--input", "1x8x8", "--torch-args", '{"width": 6, "classes": 5}']
    status, out, err = run(["compare", *net, "--batch", "4", "--budget", "1KiB"], capsys)
    assert status == cli.EXIT_DOES_NOT_FIT, err
    given = shlex.split(out.rsplit("with snlite ", 1)[1].strip())
    assert given[:6] == ["plan", *net], given
    status, out, err = run(given + ["--save-program", str(tmp_path / "p.json")], capsys)
    assert status == cli.EXIT_DOES_NOT_FIT, err
    assert shlex.split(out.rsplit("; snlite ", 1)[1].split(" finds ")[0])[:6] == ["compare", *net]
    assert err.strip() == ("snlite plan: not written, as the plan does not fit (no program to export): "
                           f"--save-program {tmp_path / 'p.json'}") and not (tmp_path / "p.json").exists()


@needs_torch
def test_frozen_parameters_are_warned_about_not_planned_away(tmp_path, capsys):
    """A fine-tuning model with a frozen backbone was planned as if it all trained, without a word."""
    from snlite.torch_import import FrozenParameters, from_torch

    path = tmp_path / "frozen.py"
    path.write_text(MODEL_FILE + "\n\nclass Frozen(Net):\n    def __init__(self):\n"
                    "        super().__init__()\n        self.conv.requires_grad_(False)\n")
    status, out, err = run(["plan", f"{path}:Frozen", "--input", "1x8x8", "--batch", "2"], capsys)
    assert status == 0 and err.count("warning") == 1, err
    assert err.startswith("snlite plan: warning: Frozen has 2 frozen parameter tensors (conv.weight, "
                          "conv.bias; 320 bytes, requires_grad=False): snlite trains every parameter"), err
    import importlib.util as iu

    spec = iu.spec_from_file_location("frozen_model", path)
    mod = iu.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.warns(FrozenParameters, match=r"up to 640 bytes more than a run that freezes them") as caught:
        from_torch(mod.Frozen(), (1, 8, 8), batch=2)
    assert [w.filename for w in caught] == [__file__]
    status, out, err = run(["plan", f"{path}:Net", "--input", "1x8x8", "--batch", "2"], capsys)
    assert status == 0 and err == "", err
