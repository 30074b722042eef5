"""Linear layers: gradient checks of the references (with and without the elementwise bias),
every version bit-identical through the gemm, and shape errors naming the op and argument."""

import numpy as np
import pytest
from numba import cuda

from kernels.elementwise import bias_add_ref, bias_backward_ref
from kernels.gemm import VERSIONS
from kernels.linear import (
    OPS, linear_backward_data, linear_backward_data_ref, linear_backward_filter, linear_backward_filter_ref,
    linear_forward, linear_forward_ref,
)
from gradcheck import check_backward, rand64


def test_backward_references_match_central_differences(rng):
    n, fin, fout = 4, 5, 3
    x, w, up = rand64(rng, n, fin), rand64(rng, fout, fin), rand64(rng, n, fout)
    y = np.empty((n, fout))

    def forward():
        linear_forward_ref(x, w, y)
        return y

    dx, dw = np.empty_like(x), np.empty_like(w)
    linear_backward_data_ref(up, w, dx)
    linear_backward_filter_ref(x, up, dw)
    check_backward("linear", forward, {"x": dx, "w": dw}, {"x": x, "w": w}, up)


def test_linear_with_bias_matches_central_differences(rng):
    """The layer as the runtime runs it: linear_forward then elementwise.bias_add; the bias
    gradient comes from elementwise.bias_backward."""
    n, fin, fout = 3, 4, 5
    x, w, b, up = rand64(rng, n, fin), rand64(rng, fout, fin), rand64(rng, fout), rand64(rng, n, fout)
    y = np.empty((n, fout))

    def forward():
        linear_forward_ref(x, w, y)
        bias_add_ref(y, b)
        return y

    dx, dw, db = np.empty_like(x), np.empty_like(w), np.empty_like(b)
    linear_backward_data_ref(up, w, dx)
    linear_backward_filter_ref(x, up, dw)
    bias_backward_ref(up, db)
    check_backward("linear+bias", forward, {"x": dx, "w": dw, "b": db}, {"x": x, "w": w, "b": b}, up)


@pytest.mark.parametrize("op", list(OPS))
def test_versions_are_bit_identical(rng, op):
    n, fin, fout = 9, 11, 6
    shapes = {"linear_forward": [(n, fin), (fout, fin), (n, fout)],
              "linear_backward_data": [(n, fout), (fout, fin), (n, fin)],
              "linear_backward_filter": [(n, fin), (n, fout), (fout, fin)]}[op]
    a, b = (rng.standard_normal(s).astype(np.float32) for s in shapes[:2])
    outs = {}
    for version in VERSIONS:
        out = cuda.to_device(np.full(shapes[2], np.nan, np.float32))
        OPS[op].launch(cuda.to_device(a), cuda.to_device(b), out, version=version, block=(4, 4, 2, 2))
        outs[version] = out.copy_to_host()
    for version in VERSIONS:
        assert np.array_equal(outs[version], outs[VERSIONS[0]]), f"{op} {version} differs from {VERSIONS[0]}"
    want = np.empty(shapes[2])
    OPS[op].reference(a.astype(np.float64), b.astype(np.float64), want)
    np.testing.assert_allclose(outs[VERSIONS[0]], want, rtol=1e-4, atol=1e-5)


def _dev(*shape):
    return cuda.to_device(np.zeros(shape, np.float32))


@pytest.mark.parametrize("call,match", [
    (lambda: linear_forward(_dev(7, 13), _dev(5, 12), _dev(7, 5)),
     r"linear_forward w: expected shape \(out_features, 13\)"),
    (lambda: linear_forward(_dev(7, 13), _dev(5, 13), _dev(5, 7)),
     r"linear_forward y: expected shape \(7, 5\)"),
    (lambda: linear_forward(_dev(91), _dev(5, 13), _dev(7, 5)), "linear_forward x: expected a 2-D array"),
    (lambda: linear_backward_data(_dev(7, 5), _dev(4, 13), _dev(7, 13)),
     r"linear_backward_data w: expected shape \(5, in_features\)"),
    (lambda: linear_backward_data(_dev(7, 5), _dev(5, 13), _dev(7, 5)),
     r"linear_backward_data dx: expected shape \(7, 13\)"),
    (lambda: linear_backward_filter(_dev(7, 13), _dev(6, 5), _dev(5, 13)),
     "linear_backward_filter dy: expected batch 7"),
    (lambda: linear_backward_filter(_dev(7, 13), _dev(7, 5), _dev(13, 5)),
     r"linear_backward_filter dw: expected shape \(5, 13\)"),
    (lambda: linear_forward(_dev(7, 13), _dev(5, 13), _dev(7, 5), version="v2", block=(64, 4)),
     "v2 tiles are at most"),
])
def test_bad_arguments_are_refused(call, match):
    with pytest.raises(ValueError, match=match):
        call()
