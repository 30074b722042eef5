"""snlite.from_torch on transformers: torchvision's ViT and Swin import whole, under PyTorch's names,
and what snlite does not compute of them (attention that is not self-attention, or whose weights are
read; tokens joined or averaged in ways snlite has no layer for; Swin V2, windows that do not tile the
map, stochastic depth) is refused, saying what it imports instead. The convolutional families, and
the numbers checked against PyTorch's, are in tests/test_from_torch.py.

Needs torch and torchvision (the ``torch`` extra); skipped, with the reason shown, without them."""
import importlib.util

import pytest

from snlite.train import Model

torch = pytest.importorskip("torch", reason="PyTorch is not installed: pip install -e \".[torch]\"")
if importlib.util.find_spec("torchvision") is None:
    pytest.skip("torchvision is not installed: pip install -e \".[torch]\"", allow_module_level=True)

from snlite.torch_import import TorchImportError, from_torch, import_torchvision, torch_params  # noqa: E402
from torch_modules import Net, Scale, refused  # noqa: E402

tv = import_torchvision().models
torch.set_num_threads(1)  # the tests run one per core
nn = torch.nn


def test_vit_imports_whole_with_its_state_dict_names():
    """torchvision's ViT-B/16: every weight, under PyTorch's names; the reshape and permute of the patches
    are no layers, the class token is the model's own parameter, MultiheadAttention is three layers whose
    in-projection holds its in_proj_weight and in_proj_bias, and x[:, 0] reads the class token."""
    net = tv.vit_b_16(num_classes=10)
    g = from_torch(net, (3, 224, 224), batch=2)
    assert g.param_count() == sum(p.numel() for p in net.parameters())
    t, mha = g.tensors(), "encoder.layers.encoder_layer_11.self_attention"
    assert t["class_token"].shape == (1, 1, 768) and t["encoder.pos_embedding"].shape == (1, 197, 768)
    assert t[f"{mha}.in_proj_weight"].shape == (2304, 768) and t[f"{mha}.out_proj.bias"].shape == (768,)
    assert g.layers[f"{mha}.attention"].attrs["heads"] == 12
    assert g.layers["token_select"].out_shape == (2, 768)
    assert g.layers["conv_proj"].out_shape == (2, 768, 14, 14)
    assert sorted(n for n, s in t.items() if s.kind == "weight") == sorted(torch_params(net))


class _Tokens(nn.Module):
    """Patches to tokens as ViT makes them, then a forward of one's own."""

    def __init__(self, forward, **modules):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 2, stride=2)
        for k, m in modules.items():
            self.add_module(k, m)
        self.fc = nn.Linear(8, 5)
        self._fwd = forward

    def forward(self, x):
        x = self.conv(x)
        return self.fc(self._fwd(self, x.reshape(x.shape[0], 8, -1).permute(0, 2, 1)))


@pytest.mark.parametrize("forward, modules, words", [
    (lambda s, x: s.mha(x, x, x, need_weights=False)[0][:, 0], {"mha": nn.MultiheadAttention(8, 2)},
     ("batch_first=False is not supported yet",)),
    (lambda s, x: s.mha(x, x, x, need_weights=False)[0][:, 0],
     {"mha": nn.MultiheadAttention(8, 2, dropout=0.1, batch_first=True)},
     ("dropout=0.1 is not supported yet",)),
    (lambda s, x: (lambda o: o[0][:, 0] + o[1][:, 0, :8])(s.mha(x, x, x)),
     {"mha": nn.MultiheadAttention(8, 2, batch_first=True)},
     ("it reads the attention weights", "need_weights=False")),
    (lambda s, x: (lambda k: s.mha(x, k, k, need_weights=False)[0][:, 0])(s.ln(x)),
     {"mha": nn.MultiheadAttention(8, 2, batch_first=True), "ln": nn.LayerNorm(8)},
     ("self_attention=False is not supported yet",)),
    (lambda s, x: torch.cat([x, s.token.gamma.expand(x.shape[0], -1, -1)], dim=1)[:, 0],
     {"token": Scale(1, 1, 8)},
     ("a cat of token.gamma (1, 1, 8) and tokens (2, 16, 8) along dim 1", "a (1, 1, D) token first")),
    (lambda s, x: (x + s.pos.gamma)[:, 0], {"pos": Scale(16, 8)},
     ("snlite adds a position embedding of shape (1, 16, 8)",)),
    (lambda s, x: x.mean(1, keepdim=True)[:, 0], {},
     ("a mean of tokens (N, T, D) over dims 1 (keepdim=True)",)),
    (lambda s, x: torch.cat([x, x], 1)[:, 0], {}, ("a concat of tokens (N, T, D)", "x.mean(dim=1)")),
], ids=["batch first", "attention dropout", "attention weights", "cross-attention", "the token last",
        "an embedding of another shape", "a mean over tokens kept", "tokens joined"])
def test_what_vit_needs_and_no_more(forward, modules, words):
    """ViT's tokens, class token, position embedding, self-attention and x[:, 0] import (tests above);
    what snlite does not compute is refused, saying what it imports instead."""
    with pytest.raises(TorchImportError) as e:
        from_torch(_Tokens(forward, **modules), (3, 8, 8), batch=2)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_x_colon_index_of_a_feature_map_is_no_token():
    refused(Net(lambda s, y: y[:, 0].repeat(1, 4, 1).view(-1, 4, 8, 8)), "x[:, 0] of a tensor (2, 4, 8, 8)",
             "one token of tokens (N, T, D)")


def test_a_transformer_encoder_module_is_refused_with_the_block_to_write_instead():
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    with pytest.raises(TorchImportError,
                       match=r"TransformerEncoderLayer has no snlite layer.*nn.MultiheadAttention"):
        from_torch(_Tokens(lambda s, x: s.enc(x)[:, 0], enc=layer), (3, 8, 8), batch=2)


def _no_stochastic_depth(net):
    for m in net.modules():
        if isinstance(m, tv.swin_transformer.StochasticDepth):
            m.p = 0.0
    return net


def test_swin_imports_whole_with_its_state_dict_names():
    """torchvision's Swin-T: every weight, under PyTorch's names; its window attention is three layers
    (qkv, the attention holding the relative position bias table, proj), shifted every second block and
    not where the window covers the map (the last stage, 7x7); the relative position index, a buffer,
    is checked and skipped, since snlite computes it from the window."""
    net = _no_stochastic_depth(tv.swin_t(num_classes=10))  # swin_t's builder sets it: 0.2
    g = from_torch(net, (3, 224, 224), batch=1)
    assert g.param_count() == sum(p.numel() for p in net.parameters())
    shifts = {n: l.attrs["shift"] for n, l in g.layers.items() if l.kind == "window_attention"}
    assert shifts["features.1.0.attn"] == (0, 0) and shifts["features.1.1.attn"] == (3, 3)
    assert shifts["features.7.1.attn"] == (0, 0)  # a 7x7 map in 7x7 windows: nothing to shift
    assert g.tensors()["features.1.1.attn.relative_position_bias_table"].shape == (169, 3)
    assert g.layers["features.2.patch_merge"].out_shape == (1, 384, 28, 28)
    small = _small_swin()
    model = Model(from_torch(small, (3, 8, 8), batch=2), device="host")
    model.set_params(small.state_dict())  # the index buffers included, checked, skipped
    index = small.state_dict()["features.1.0.attn.relative_position_index"]
    with pytest.raises(ValueError, match="features.1.0.attn.relative_position_index is not the relative "
                                         "position index of the layer's window"):
        model.set_params({**small.state_dict(), "features.1.0.attn.relative_position_index": index.flip(0)})


def _small_swin(**kw):
    """torchvision's SwinTransformer in small, on 8x8 images: 4x4 maps in 2x2 windows unless told."""
    args = dict(patch_size=[2, 2], embed_dim=8, depths=[2], num_heads=[2], window_size=[2, 2], num_classes=10,
                stochastic_depth_prob=0.0)
    return tv.swin_transformer.SwinTransformer(**{**args, **kw})


@pytest.mark.parametrize("make, words", [
    (lambda: _small_swin(block=tv.swin_transformer.SwinTransformerBlockV2,
                         downsample_layer=tv.swin_transformer.PatchMergingV2), ("relative_coords_table",)),
    (lambda: _small_swin(window_size=[3, 3]),
     ("a window attention over a 4x4 map in windows of (3, 3)", "224x224 for torchvision's Swin")),
    (lambda: _small_swin(stochastic_depth_prob=0.2), ("stochastic depth (p=",)),
], ids=["swin v2", "windows that do not tile the map", "stochastic depth on"])
def test_what_swin_needs_and_no_more(make, words):
    with pytest.raises(TorchImportError) as e:
        from_torch(make(), (3, 8, 8), batch=1)
    for w in words:
        assert w in str(e.value), str(e.value)
