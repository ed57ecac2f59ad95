"""End to end: a small ResNet-style CNN trained 20 SGD steps with torch's BatchNorm and with
norma's (norma.torch.convert on a copy): the same loss at every step (also against float64),
the same gradients, running statistics and updates, in both memory formats (contiguous and
channels_last); the same state_dict keys; after training fold_bn(model) gives the eval-mode
output.

The model has every BN use of a ResNet: conv-BN-ReLU stem, a residual block (conv-BN-ReLU,
conv-BN, add, ReLU), a strided downsampling block with a conv-BN shortcut, global average
pooling, and a Linear-BatchNorm1d-ReLU-Linear head.  Data and initial weights are seeded.
"""

import copy
import statistics

import pytest
import torch
from torch import nn

import norma.torch as nt
from conftest import count_norma_calls

STEPS = 20


class Block(nn.Module):
    """A basic residual block; layers registered in the order they are used (fold_bn relies on
    it: conv1 -> bn1, conv2 -> bn2, and the shortcut's conv -> bn in its own Sequential)."""

    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.shortcut is None else self.shortcut(x)
        return self.relu(out + identity)


class SmallResNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8),
                                  nn.ReLU(inplace=True))
        self.layer1 = Block(8, 8)
        self.layer2 = Block(8, 16, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(),
                                  nn.Linear(32, classes))

    def forward(self, x):
        x = self.layer2(self.layer1(self.stem(x)))
        return self.head(torch.flatten(self.pool(x), 1))


def _data(steps, batch=16, classes=10, hw=16):
    """A learnable task: each class has a fixed random template; a sample is its class's
    template plus noise (with an offset and scale, so the BN statistics are not trivial)."""
    g = torch.Generator().manual_seed(7)
    templates = torch.randn(classes, 3, hw, hw, generator=g)
    ys = [torch.randint(0, classes, (batch,), generator=g) for _ in range(steps)]
    xs = [2.0 * (templates[y] + torch.randn(batch, 3, hw, hw, generator=g)) + 0.5 for y in ys]
    return xs, ys


def _bn_modules(model):
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def _loss(model, x, y):
    return nn.functional.cross_entropy(model(x), y)


def _param_errors(nmodel, tmodel, attr):
    """Normwise relative difference of each parameter's .grad (attr="grad") or value."""
    out = {}
    tp = dict(tmodel.named_parameters())
    for k, p in nmodel.named_parameters():
        if k == "head.0.bias":
            continue  # a bias right before a BN: its true gradient is 0, its value never moves
        a = p.grad if attr == "grad" else p
        b = tp[k].grad if attr == "grad" else tp[k]
        out[k] = ((a.double() - b.double()).norm() / b.double().norm()).item()
    return out


@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last],
                         ids=["contiguous", "channels_last"])
def test_training_losses_match_torch(fmt, torch_backend):
    """20 SGD steps (momentum, weight decay) of torch's model; at every step norma's model
    starts from torch's parameters and buffers (load_state_dict: the same state_dict keys) and
    must give the same loss, gradients, running statistics and updated parameters.

    Why the models are re-synchronized at each step rather than trained apart: two float32 runs
    part ways for good as soon as one ReLU input lies within rounding of 0 and flips its mask
    (seen here between torch float32 and float64 too): the gradients of that step differ by
    ~1e-3 in the layers before it, and SGD with momentum grows that to a few % of the loss
    within 20 steps.  Re-synchronized, such a flip costs one step's gradients ~1e-3 (allowed in
    the max, not in the median) and the loss stays equal to float32 rounding."""
    torch.manual_seed(0)
    tmodel = SmallResNet().to(memory_format=fmt)
    nmodel = nt.convert(copy.deepcopy(tmodel))
    n_bn = len(_bn_modules(tmodel))
    assert n_bn == 7
    assert all(type(m).__module__.startswith("norma.torch") for m in _bn_modules(nmodel))
    assert sum(isinstance(m, nt.BatchNorm1d) for m in nmodel.modules()) == 1

    # the same state_dict keys, in the same order, and the same values before training
    tsd, nsd = tmodel.state_dict(), nmodel.state_dict()
    assert list(tsd.keys()) == list(nsd.keys())
    for k in tsd:
        assert torch.equal(tsd[k], nsd[k]), k

    # BN outputs keep the memory format of their input
    seen = []

    def hook(m, inp, out):
        if out.dim() == 4:
            seen.append(out.is_contiguous(memory_format=fmt))

    handles = [m.register_forward_hook(hook) for m in _bn_modules(nmodel)]
    topt = torch.optim.SGD(tmodel.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    nopt = torch.optim.SGD(nmodel.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    xs, ys = _data(STEPS)
    losses = []
    with count_norma_calls() as counted_calls:  # the profiler is slow: the first 2 steps
        _train_in_step(tmodel, nmodel, topt, nopt, xs[:2], ys[:2], fmt, losses, 0)
    _train_in_step(tmodel, nmodel, topt, nopt, xs[2:], ys[2:], fmt, losses, 2)
    for h in handles:
        h.remove()
    assert seen and all(seen)
    assert losses[-1] < losses[0] - 0.5, losses  # it did learn

    # norma computed every BN forward and backward (no fallback to torch)
    assert counted_calls["forward"] == 2 * n_bn, counted_calls
    assert counted_calls["backward"] == 2 * n_bn, counted_calls

    # eval mode on the same state, then the folded inference copies
    nmodel.load_state_dict(tmodel.state_dict())
    tmodel.eval()
    nmodel.eval()
    xe = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(3))
    xe = xe.contiguous(memory_format=fmt)
    with torch.no_grad():
        en = nmodel(xe)
        torch.testing.assert_close(en, tmodel(xe), rtol=1e-4, atol=1e-4)
        for model, ref_out in ((nmodel, en), (tmodel, tmodel(xe))):
            folded = nt.fold_bn(model)
            assert not _bn_modules(folded), folded      # every BN followed a conv / linear
            assert len(_bn_modules(model)) == n_bn      # the model itself is untouched
            assert model.training is False
            torch.testing.assert_close(folded(xe), ref_out, rtol=1e-4, atol=1e-4)


def _train_in_step(tmodel, nmodel, topt, nopt, xs, ys, fmt, losses, start):
    """The loop of test_training_losses_match_torch: at every step norma's model starts from
    torch's state and must match its loss, gradients, buffers and update."""
    for step, (x, y) in enumerate(zip(xs, ys), start):
        nmodel.load_state_dict(tmodel.state_dict())
        dmodel = copy.deepcopy(tmodel).double()          # the same state in float64
        x = x.contiguous(memory_format=fmt)
        lt, ln, ld = _loss(tmodel, x, y), _loss(nmodel, x, y), _loss(dmodel, x.double(), y)
        topt.zero_grad()
        nopt.zero_grad()
        lt.backward()
        ln.backward()
        losses.append(lt.item())
        what = "step %d" % step
        # the loss: equal to float32 rounding, to torch and to the float64 forward
        assert ln.item() == pytest.approx(lt.item(), rel=5e-6), what
        assert ln.item() == pytest.approx(ld.item(), rel=5e-6), what
        # gradients: all but a flipped ReLU's share to rounding; none far off
        g = _param_errors(nmodel, tmodel, "grad")
        assert statistics.median(g.values()) < 1e-4, (what, g)
        assert max(g.values()) < 2e-2, (what, g)
        # running statistics and step counters, updated by the forward
        tb = dict(tmodel.named_buffers())
        for k, b in nmodel.named_buffers():
            if k.endswith("num_batches_tracked"):
                assert int(b) == int(tb[k]) == step + 1, (what, k)
            else:
                torch.testing.assert_close(b, tb[k], rtol=1e-4, atol=1e-6,
                                           msg=lambda m: "%s %s: %s" % (what, k, m))
        topt.step()
        nopt.step()
        p = _param_errors(nmodel, tmodel, "value")
        assert statistics.median(p.values()) < 1e-5, (what, p)


def test_training_apart_stays_close():
    """The two models trained apart (no re-synchronization), plain SGD: the losses agree at
    every step within a tolerance that a flipped ReLU mask fits in, and both learn."""
    torch.manual_seed(0)
    tmodel = SmallResNet()
    nmodel = nt.convert(copy.deepcopy(tmodel))
    xs, ys = _data(STEPS)
    res = []
    for model in (tmodel, nmodel):
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        out = []
        for x, y in zip(xs, ys):
            loss = _loss(model, x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            out.append(loss.item())
        res.append(out)
    lt, ln = res
    assert ln[0] == pytest.approx(lt[0], rel=5e-6)
    assert ln == pytest.approx(lt, rel=1e-2)
    assert ln[-1] < ln[0] - 0.5 and lt[-1] < lt[0] - 0.5, (lt, ln)


def test_training_cumulative_momentum_and_reload():
    """momentum=None (cumulative average) through convert: the running statistics follow
    torch's step by step; a state_dict saved by the norma model loads into torch's model (and
    back) with equal eval outputs."""
    torch.manual_seed(1)
    tmodel = SmallResNet()
    for m in _bn_modules(tmodel):
        m.momentum = None
    nmodel = nt.convert(copy.deepcopy(tmodel))
    topt = torch.optim.SGD(tmodel.parameters(), lr=0.05)
    xs, ys = _data(5)
    for x, y in zip(xs, ys):
        nmodel.load_state_dict(tmodel.state_dict())
        lt, ln = _loss(tmodel, x, y), _loss(nmodel, x, y)
        assert ln.item() == pytest.approx(lt.item(), rel=5e-6)
        tb = dict(tmodel.named_buffers())
        for k, b in nmodel.named_buffers():
            torch.testing.assert_close(b, tb[k], rtol=1e-5, atol=1e-6)
        topt.zero_grad()
        lt.backward()
        topt.step()
    nmodel.load_state_dict(tmodel.state_dict())
    fresh = SmallResNet()
    fresh.load_state_dict(nmodel.state_dict())
    fresh.eval()
    nmodel.eval()
    x = xs[0][:4]
    with torch.no_grad():
        torch.testing.assert_close(fresh(x), nmodel(x), rtol=1e-5, atol=1e-5)
    back = nt.convert(SmallResNet())
    back.load_state_dict(tmodel.state_dict())
    back.eval()
    tmodel.eval()
    with torch.no_grad():
        torch.testing.assert_close(back(x), tmodel(x), rtol=1e-5, atol=1e-5)
