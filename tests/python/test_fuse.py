"""norma.torch.fuse_bn_relu / convert(fuse=True): BatchNorm fused with the ReLU, or the
residual add + ReLU, after it (torch.fx).  The fused model must give the unfused converted
model's outputs, gradients and running statistics (bitwise: the fused kernels do the same
float32 operations), on both backends, both memory formats, training and eval; and only the
patterns that are safe to fuse are fused."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import norma.torch as nt

torchvision = pytest.importorskip("torchvision")


def _fused_count(model):
    return sum(1 for m in model.modules() if getattr(m, "fuse_relu", False))


def _run(model, x, train):
    model.train(train)
    x = x.clone().requires_grad_(train)
    y = model(x)
    if not train:
        return y.detach(), [], []
    (y.float() * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    bufs = [b.clone() for b in model.buffers()]
    return y.detach(), grads, bufs


@pytest.mark.parametrize("name,expect", [("resnet18", 17), ("resnet50", 49)])
@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("train", [True, False])
def test_torchvision_resnets_fuse_and_match(torch_backend, name, expect, fmt, train):
    torch.manual_seed(0)
    base = getattr(torchvision.models, name)(num_classes=7).to(memory_format=fmt)
    with torch.no_grad():  # running statistics away from the init, so eval means something
        for m in base.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    plain = nt.convert(copy.deepcopy(base))
    fused = nt.convert(copy.deepcopy(base), fuse=True)
    assert isinstance(fused, torch.fx.GraphModule)
    # every BN but the downsample branches' (their output is the add's other operand)
    assert _fused_count(fused) == expect
    assert _fused_count(plain) == 0
    assert fused.state_dict().keys() == plain.state_dict().keys()
    x = torch.randn(2, 3, 40, 40).to(memory_format=fmt)
    ya, ga, ba = _run(plain, x, train)
    yb, gb, bb = _run(fused, x, train)
    assert torch.equal(ya, yb)
    for a, b in zip(ga + ba, gb + bb):
        assert torch.equal(a, b)
    assert fused.training == train


class Patterns(nn.Module):
    """One of each pattern, and the cases that must stay unfused."""

    def __init__(self):
        super().__init__()
        c = 5
        self.bn_mod = nn.BatchNorm2d(c)       # -> nn.ReLU module: fused
        self.bn_fn = nn.BatchNorm2d(c)        # -> F.relu: fused
        self.bn_method = nn.BatchNorm2d(c)    # -> .relu(): fused
        self.bn_add = nn.BatchNorm2d(c)       # -> r + bn, then torch.relu: fused with r
        self.bn_two_users = nn.BatchNorm2d(c)  # output read twice: not fused
        self.bn_twice = nn.BatchNorm2d(c)     # module called twice: not fused
        self.bn_sigmoid = nn.BatchNorm2d(c)   # -> sigmoid: not fused
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        a = self.relu(self.bn_mod(x))
        b = F.relu(self.bn_fn(a))
        c = self.bn_method(b).relu()
        d = torch.relu(x + self.bn_add(c))
        e = self.bn_two_users(d)
        f = F.relu(e) + e
        g = F.relu(self.bn_twice(f))
        g = F.relu(self.bn_twice(g))
        return torch.sigmoid(self.bn_sigmoid(g))


@pytest.mark.parametrize("train", [True, False])
def test_patterns(torch_backend, train):
    torch.manual_seed(1)
    base = Patterns()
    plain = nt.convert(copy.deepcopy(base))
    fused = nt.fuse_bn_relu(nt.convert(copy.deepcopy(base)))
    names = {n for n, m in fused.named_modules() if getattr(m, "fuse_relu", False)}
    assert names == {"bn_mod", "bn_fn", "bn_method", "bn_add"}
    x = torch.randn(3, 5, 6, 7)
    ya, ga, ba = _run(plain, x, train)
    yb, gb, bb = _run(fused, x, train)
    assert torch.equal(ya, yb)
    for a, b in zip(ga + ba, gb + bb):
        assert torch.equal(a, b)


def test_torch_batchnorm_is_left_alone():
    # fuse_bn_relu fuses norma's modules only: a model not converted keeps its graph
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.ReLU())
    gm = nt.fuse_bn_relu(model)
    assert _fused_count(gm) == 0
    assert any(n.op == "call_module" and n.target == "2" for n in gm.graph.nodes)


def test_untraceable_model_raises():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm2d(2)

        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow: torch.fx cannot trace it
                return F.relu(self.bn(x))
            return x

    with pytest.raises(torch.fx.proxy.TraceError):
        nt.convert(Branchy(), fuse=True)


def test_fused_model_scripts_and_saves(tmp_path):
    from norma.torch import _ops
    if _ops.backend() != "extension":
        pytest.skip("TorchScript needs libnorma_torch: %s" % _ops.extension_status()["reason"])
    torch.manual_seed(2)
    model = nt.convert(torchvision.models.resnet18(num_classes=3), fuse=True).eval()
    x = torch.randn(1, 3, 32, 32)
    scripted = torch.jit.script(model)
    assert torch.equal(scripted(x), model(x))
    path = tmp_path / "fused.pt"
    torch.jit.save(scripted, str(path))
    assert torch.equal(torch.jit.load(str(path))(x), model(x))
