"""norma.torch.BatchNorm1d/2d/3d as drop-in replacements of torch.nn's, convert(), fold_bn()."""

import copy
import math

import pytest
import torch
from torch import nn

import norma.torch as nt
import bn_reference as ref

PAIRS = [(nn.BatchNorm1d, nt.BatchNorm1d), (nn.BatchNorm2d, nt.BatchNorm2d),
         (nn.BatchNorm3d, nt.BatchNorm3d)]


def _np(t):
    return t.detach().double().numpy()


def _close(a, b, dtype="float32", scale=1.0, what=""):
    assert a.dtype == b.dtype, (what, a.dtype, b.dtype)
    ref.assert_close(_np(a), _np(b), dtype, scale=scale, what=what)


@pytest.mark.parametrize("kw", [{}, {"affine": False}, {"track_running_stats": False},
                                {"momentum": None, "eps": 1e-3}])
@pytest.mark.parametrize("pair", PAIRS, ids=["1d", "2d", "3d"])
def test_state_dict_parameters_buffers_match_torch(pair, kw):
    tcls, ncls = pair
    t, n = tcls(5, **kw), ncls(5, **kw)
    assert isinstance(n, tcls)
    assert list(n.state_dict().keys()) == list(t.state_dict().keys())
    assert [k for k, _ in n.named_parameters()] == [k for k, _ in t.named_parameters()]
    assert [k for k, _ in n.named_buffers()] == [k for k, _ in t.named_buffers()]
    for (k, a), (_, b) in zip(n.state_dict().items(), t.state_dict().items()):
        assert a.dtype == b.dtype and torch.equal(a, b), k
    assert repr(n).endswith(repr(t)[len(type(t).__name__):])
    # state dicts load both ways
    t.load_state_dict(n.state_dict())
    n.load_state_dict(t.state_dict())


def test_constructor_device_dtype_and_repr():
    n = nt.BatchNorm2d(4, device="cpu", dtype=torch.float64)
    assert n.weight.dtype == torch.float64 and n.running_var.dtype == torch.float64
    assert "fuse_relu" not in repr(n)
    assert "fuse_relu=True" in repr(nt.BatchNorm2d(4, fuse_relu=True))


def _train_steps(tm, nm, make_x, steps=3, lr=0.1):
    """Runs the same steps on the torch module and the norma module; compares everything."""
    opt_t = torch.optim.SGD(tm.parameters(), lr=lr) if list(tm.parameters()) else None
    opt_n = torch.optim.SGD(nm.parameters(), lr=lr) if list(nm.parameters()) else None
    for step in range(steps):
        x, gy = make_x(step)
        xt, xn = x.clone().requires_grad_(), x.clone().requires_grad_()
        yt, yn = tm(xt), nm(xn)
        yt.backward(gy)
        yn.backward(gy)
        dt = "bfloat16" if x.dtype == torch.bfloat16 else (
            "float64" if x.dtype == torch.float64 else "float32")
        m = x.shape[0] * int(math.prod(x.shape[2:]))
        _close(yn, yt, dt, what="y step %d" % step)
        assert yn.stride() == yt.stride()
        _close(xn.grad, xt.grad, dt, scale=2, what="dx step %d" % step)
        for (k, pn), (_, pt) in zip(nm.named_parameters(), tm.named_parameters()):
            _close(pn.grad, pt.grad, "bfloat16" if dt == "bfloat16" else
                   ("float64" if dt == "float64" else "float32"), scale=2 * math.sqrt(m),
                   what="d%s step %d" % (k, step))
        for (k, bn_), (_, bt) in zip(nm.named_buffers(), tm.named_buffers()):
            if bt.dtype == torch.long:
                assert torch.equal(bn_, bt), k
            else:
                _close(bn_, bt, "float64" if bt.dtype == torch.float64 else "float32", what=k)
        if opt_t:
            opt_t.step()
            opt_n.step()
            opt_t.zero_grad()
            opt_n.zero_grad()


def _maker(shape, dtype=torch.float32, fmt=None, mean=0.3):
    def make(step):
        g = torch.Generator().manual_seed(100 + step)
        x = (torch.randn(shape, generator=g, dtype=torch.float64) * (1 + step) + mean).to(dtype)
        gy = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
        if fmt is not None:
            x = x.to(memory_format=fmt)
            gy = gy.to(memory_format=fmt)
        return x, gy
    return make


@pytest.mark.parametrize("momentum", [0.1, None, 0.0, 1.0])
@pytest.mark.parametrize("kw", [{}, {"affine": False}, {"track_running_stats": False}])
def test_batchnorm2d_training_then_eval_parity(momentum, kw):
    tm = nn.BatchNorm2d(17, momentum=momentum, **kw)
    if tm.affine:
        with torch.no_grad():
            tm.weight.uniform_(0.5, 1.5)
            tm.bias.uniform_(-0.5, 0.5)
    nm = nt.BatchNorm2d(17, momentum=momentum, **kw)
    nm.load_state_dict(tm.state_dict())
    _train_steps(tm, nm, _maker((5, 17, 7, 7)))
    tm.eval()
    nm.eval()
    _train_steps(tm, nm, _maker((1, 17, 7, 7)), steps=2)   # N = 1 is fine in eval
    assert torch.equal(nm.num_batches_tracked, tm.num_batches_tracked) \
        if tm.num_batches_tracked is not None else nm.num_batches_tracked is None


@pytest.mark.parametrize("shape", [(5, 3), (2, 17, 7), (2, 1, 49)])
def test_batchnorm1d_parity(shape):
    tm, nm = nn.BatchNorm1d(shape[1]), nt.BatchNorm1d(shape[1])
    _train_steps(tm, nm, _maker(shape))
    tm.eval()
    nm.eval()
    _train_steps(tm, nm, _maker(shape), steps=1)


@pytest.mark.parametrize("fmt", [None, torch.channels_last_3d])
def test_batchnorm3d_parity(fmt):
    tm, nm = nn.BatchNorm3d(3), nt.BatchNorm3d(3)
    _train_steps(tm, nm, _maker((2, 3, 1, 7, 7), fmt=fmt))
    tm.eval()
    nm.eval()
    _train_steps(tm, nm, _maker((2, 3, 1, 7, 7), fmt=fmt), steps=1)


def test_batchnorm2d_channels_last_parity():
    tm, nm = nn.BatchNorm2d(17), nt.BatchNorm2d(17)
    make = _maker((5, 17, 7, 7), fmt=torch.channels_last)
    x, _ = make(0)
    y = nm(x)
    assert y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous()
    tm(x)  # keep the running statistics in step
    _train_steps(tm, nm, make)


def test_bfloat16_input_float32_params_like_torch():
    tm, nm = nn.BatchNorm2d(3), nt.BatchNorm2d(3)
    _train_steps(tm, nm, _maker((5, 3, 7, 7), dtype=torch.bfloat16))
    assert nm.weight.dtype == torch.float32 and nm.running_mean.dtype == torch.float32
    tm.eval()
    nm.eval()
    _train_steps(tm, nm, _maker((2, 3, 7, 7), dtype=torch.bfloat16), steps=1)


def test_float64_module():
    tm = nn.BatchNorm2d(3, dtype=torch.float64)
    nm = nt.BatchNorm2d(3, dtype=torch.float64)
    _train_steps(tm, nm, _maker((2, 3, 7, 7), dtype=torch.float64))


def test_float16_module_runs_where_torch_cpu_has_none():
    nm = nt.BatchNorm2d(3)
    tm = nn.BatchNorm2d(3)
    x, gy = _maker((5, 3, 7, 7), dtype=torch.float16)(0)
    xa = x.clone().requires_grad_()
    y = nm(xa)
    y.backward(gy)
    assert y.dtype == torch.float16 and xa.grad.dtype == torch.float16
    xb = x.float().requires_grad_()
    yt = tm(xb)
    yt.backward(gy.float())
    _close(y, yt.half(), "float16", what="y")
    _close(xa.grad, xb.grad.half(), "float16", scale=2, what="dx")
    _close(nm.running_var, tm.running_var, what="running_var")


def test_fused_relu_module_and_residual():
    tm, nm = nn.BatchNorm2d(3), nt.BatchNorm2d(3, fuse_relu=True)
    x, gy = _maker((2, 3, 7, 7))(0)
    r = torch.randn(x.shape, generator=torch.Generator().manual_seed(5))
    xa, ra, xb, rb = (t.clone().requires_grad_() for t in (x, r, x, r))
    y = nm(xa, ra)
    yt = torch.relu(tm(xb) + rb)
    y.backward(gy)
    yt.backward(gy)
    _close(y, yt, what="y")
    _close(xa.grad, xb.grad, scale=2, what="dx")
    _close(ra.grad, rb.grad, what="dresidual")
    _close(nm.running_mean, tm.running_mean, what="running_mean")
    _close(nm(x), torch.relu(tm(x)), what="relu only")
    with pytest.raises(ValueError, match="fuse_relu=True"):
        nt.BatchNorm2d(3)(x, r)


def test_input_checks_and_fallbacks_like_torch():
    nm = nt.BatchNorm2d(3)
    with pytest.raises(ValueError, match="expected 4D input"):
        nm(torch.zeros(3, 4, 4))
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        nm(torch.zeros(1, 3, 1, 1))
    # an empty batch goes to torch's implementation, as do dtypes norma does not take
    assert nm(torch.zeros(0, 3, 4, 4)).shape == (0, 3, 4, 4)


# ---- convert -------------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x))))) + x)


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8),
                                  nn.ReLU(inplace=True))
        self.block = Block(8)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Linear(8, 17)
        self.bn_fc = nn.BatchNorm1d(17)
        self.fc2 = nn.Linear(17, 5)

    def forward(self, x):
        x = self.block(self.stem(x))
        x = self.pool(x).flatten(1)
        return self.fc2(torch.relu(self.bn_fc(self.fc1(x))))


def _randomize_bn(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.2)
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.2)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)


def test_convert_small_cnn_state_kept_and_parity():
    torch.manual_seed(0)
    model = SmallCNN()
    _randomize_bn(model)
    twin = copy.deepcopy(model)
    params_before = {k: p for k, p in model.named_parameters()}
    sd_before = {k: v.clone() for k, v in model.state_dict().items()}
    conv = nt.convert(model)
    assert conv is model
    kinds = [type(m) for m in conv.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    assert kinds == [nt.BatchNorm2d, nt.BatchNorm2d, nt.BatchNorm2d, nt.BatchNorm1d]
    assert list(conv.state_dict().keys()) == list(sd_before.keys())
    for k, v in conv.state_dict().items():
        assert torch.equal(v, sd_before[k]), k
    for k, p in conv.named_parameters():
        assert p is params_before[k], k  # same Parameter objects: optimizers stay valid
    opt_n = torch.optim.SGD(conv.parameters(), lr=0.05)
    opt_t = torch.optim.SGD(twin.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    for step in range(2):
        x = torch.randn(4, 3, 7, 7, generator=g)
        yn, yt = conv(x), twin(x)
        _close(yn, yt, scale=2, what="train out %d" % step)
        yn.square().sum().backward()
        yt.square().sum().backward()
        for (k, pn), (_, pt) in zip(conv.named_parameters(), twin.named_parameters()):
            _close(pn.grad, pt.grad, scale=20, what="grad %s" % k)
        opt_n.step()
        opt_t.step()
        opt_n.zero_grad()
        opt_t.zero_grad()
    for (k, bn_), (_, bt) in zip(conv.named_buffers(), twin.named_buffers()):
        if bt.dtype == torch.long:
            assert torch.equal(bn_, bt)
        else:
            _close(bn_, bt, what=k)
    conv.eval()
    twin.eval()
    x = torch.randn(1, 3, 7, 7, generator=g)
    _close(conv(x), twin(x), scale=2, what="eval out")
    # channels_last through the converted model
    xc = torch.randn(2, 3, 7, 7, generator=g).to(memory_format=torch.channels_last)
    _close(conv(xc), twin(xc), scale=2, what="eval out channels_last")


def test_convert_bare_module_and_training_flag():
    bn = nn.BatchNorm3d(4, momentum=None, eps=1e-3).eval()
    n = nt.convert(bn)
    assert type(n) is nt.BatchNorm3d and not n.training
    assert n.momentum is None and n.eps == 1e-3 and n.weight is bn.weight
    assert n.running_mean is bn.running_mean
    assert nt.convert(n) is n  # already norma


# ---- fold_bn -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fold_bn_equals_eval_output(dtype):
    torch.manual_seed(0)
    model = SmallCNN().to(dtype)
    _randomize_bn(model, seed=3)
    model = nt.convert(model)   # folding takes norma's modules as well as torch's
    model.train()
    x = torch.randn(4, 3, 7, 7, dtype=dtype)
    with torch.no_grad():
        model(x)  # running statistics from a batch
    sd_before = {k: v.clone() for k, v in model.state_dict().items()}
    folded = nt.fold_bn(model)
    assert model.training  # the original is untouched
    for k, v in model.state_dict().items():
        assert torch.equal(v, sd_before[k]), k
    assert not folded.training
    remaining = [n for n, m in folded.named_modules()
                 if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    assert remaining == []
    assert isinstance(folded.stem[1], nn.Identity) and isinstance(folded.block.bn1, nn.Identity)
    assert isinstance(folded.bn_fc, nn.Identity)
    assert folded.block.conv1.bias is not None  # created for a conv without bias
    model.eval()
    g = torch.Generator().manual_seed(2)
    for shape in [(1, 3, 7, 7), (5, 3, 7, 7)]:
        xe = torch.randn(shape, generator=g, dtype=dtype)
        with torch.no_grad():
            want = model(xe)
            got = folded(xe)
        ref.assert_close(_np(got), _np(want), "float64" if dtype == torch.float64 else
                         "float32", scale=10, what="folded output")


def test_fold_bn_channels_last_and_no_affine():
    seq = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, affine=False), nn.ReLU(),
                        nn.Conv2d(4, 5, 1), nn.BatchNorm2d(5))
    _randomize_bn(nn.Sequential(seq[4]), seed=4)
    with torch.no_grad():
        seq[1].running_mean.uniform_(-0.5, 0.5)
        seq[1].running_var.uniform_(0.5, 1.5)
    seq = seq.to(memory_format=torch.channels_last).eval()
    f = nt.fold_bn(seq)
    assert f[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert isinstance(f[1], nn.Identity) and isinstance(f[4], nn.Identity)
    x = torch.randn(2, 3, 7, 7).to(memory_format=torch.channels_last)
    with torch.no_grad():
        _close(f(x), seq(x), scale=4)


def test_fold_bn_leaves_what_does_not_follow_a_producer():
    seq = nn.Sequential(nn.BatchNorm2d(3), nn.Conv2d(3, 4, 1), nn.ReLU(), nn.BatchNorm2d(4),
                        nn.Conv2d(4, 5, 1), nn.BatchNorm2d(5), nn.Conv2d(5, 6, 1),
                        nn.BatchNorm2d(5, track_running_stats=False))
    seq[7] = nn.BatchNorm2d(6, track_running_stats=False)
    f = nt.fold_bn(seq)
    kinds = [type(m).__name__ for m in f]
    assert kinds == ["BatchNorm2d", "Conv2d", "ReLU", "BatchNorm2d", "Conv2d", "Identity",
                     "Conv2d", "BatchNorm2d"]
    x = torch.randn(2, 3, 5, 5)
    seq.eval()
    with torch.no_grad():
        _close(f(x), seq(x), scale=4)


def test_constant_channel_with_zero_eps_like_torch():
    x = torch.ones(4, 2, 5)
    x[:, 1] = torch.randn(4, 5)
    tm, nm = nn.BatchNorm1d(2, eps=0.0), nt.BatchNorm1d(2, eps=0.0)
    _close(nm(x), tm(x), what="y")
