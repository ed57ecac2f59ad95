"""The practices around BatchNorm that norma.torch supports, in one process (the distributed
versions are in test_distributed.py / test_sync.py): count-weighted running statistics,
precise statistics (recompute_bn_stats), non-finite diagnosis, the adaptive clip of BN's
gradients, streaming normalization, mixed precision (torch.autocast), TorchScript and tracing,
and which backend runs.  Every test runs with the extension's operators and with the ctypes
fallback (the torch_backend fixture)."""

import copy
import math
import os

import numpy as np
import pytest
import torch
from torch import nn

import norma
import norma.torch as nt
from conftest import REPO

pytestmark = pytest.mark.usefixtures("torch_backend")


def _gen(seed):
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------------------
# Count-weighted running statistics
# ------------------------------------------------------------------------------------------


def _counted_rule(batches, momentum, dims):
    """The rule of norma.h (norma_bn_running_update), written out in float64."""
    n = 0.0
    c = batches[0].shape[1]
    rm, rv = np.zeros(c), np.ones(c)
    for t, x in enumerate(batches):
        u = momentum if momentum is not None else 1.0 / (t + 1)
        xc = x.double().transpose(0, 1).reshape(c, -1).numpy()
        b = xc.shape[1]
        new = (1 - u) * n + u * b
        rm = ((1 - u) * n * rm + u * b * xc.mean(1)) / new
        rv = ((1 - u) * n * rv + u * b * xc.var(1, ddof=1)) / new
        n = new
    return n, rm, rv


@pytest.mark.parametrize("momentum", [0.1, 0.5, None])
@pytest.mark.parametrize("fmt", ["contiguous", "channels_last"])
def test_count_weighted_module_follows_the_rule(momentum, fmt):
    """Uneven batches (2, 7, 3, 1 and 5 images): the running statistics are the count-weighted
    average, not torch's equal-weight one (which the same module gives without the option)."""
    sizes = [2, 7, 3, 1, 5]
    g = _gen(1)
    batches = [torch.randn(n, 4, 3, 5, generator=g) * torch.tensor([1., 2, 3, 4]).view(1, 4, 1, 1)
               + torch.tensor([0., 10, -5, 100]).view(1, 4, 1, 1) for n in sizes]
    bn = nt.BatchNorm2d(4, momentum=momentum, count_weighted=True)
    plain = nt.BatchNorm2d(4, momentum=momentum)
    tbn = nn.BatchNorm2d(4, momentum=momentum)
    for x in batches:
        if fmt == "channels_last":
            x = x.contiguous(memory_format=torch.channels_last)
        bn(x)
        plain(x)
        tbn(x)
    n, rm, rv = _counted_rule(batches, momentum, 4)
    assert float(bn.running_count) == pytest.approx(n, rel=1e-12)
    np.testing.assert_allclose(bn.running_mean.double().numpy(), rm, rtol=2e-6, atol=1e-5)
    np.testing.assert_allclose(bn.running_var.double().numpy(), rv, rtol=2e-6, atol=1e-5)
    torch.testing.assert_close(plain.running_mean, tbn.running_mean, rtol=1e-5, atol=1e-5)
    if momentum is not None:  # with equal batches the two rules would agree: here they do not
        assert (bn.running_mean - tbn.running_mean).abs().max() > 1e-3


def test_count_weighted_state_dict_and_conversion():
    assert list(nt.BatchNorm2d(3).state_dict()) == list(nn.BatchNorm2d(3).state_dict())
    bn = nt.BatchNorm2d(3, count_weighted=True)
    assert list(bn.state_dict())[-1] == "running_count"
    assert bn.running_count.dtype == torch.float64
    assert bn.double().half().running_count.dtype == torch.float64   # stays a float64 count
    assert "count_weighted=True" in repr(bn)
    # torch's statistics without a count: the count is unknown (-1), and the next batch
    # starts it, which makes that update exactly torch's
    trained = nn.BatchNorm2d(3)
    x0 = torch.randn(6, 3, 4, 4, generator=_gen(2)) + 3
    trained(x0)
    cw = nt.BatchNorm2d(3, count_weighted=True)
    cw.load_state_dict(trained.state_dict(), strict=False)
    assert float(cw.running_count) == -1.0
    conv = nt.convert(nn.Sequential(copy.deepcopy(trained)), count_weighted=True)[0]
    assert float(conv.running_count) == -1.0 and conv.count_weighted
    assert nt.convert(nn.Sequential(nn.BatchNorm2d(3)), count_weighted=True)[0].running_count \
        == 0
    x1 = torch.randn(6, 3, 4, 4, generator=_gen(3))
    for m in (trained, cw, conv):
        m(x1)
    torch.testing.assert_close(cw.running_mean, trained.running_mean)
    torch.testing.assert_close(conv.running_var, trained.running_var)
    assert float(cw.running_count) == 6 * 16
    cw.reset_running_stats()
    assert float(cw.running_count) == 0


def test_count_weighted_functional_numpy():
    """norma.batch_norm_forward_training(running_count=...) on numpy: the C rule."""
    rng = np.random.default_rng(0)
    rm, rv, rc = np.zeros(2), np.ones(2), np.zeros(1)
    xs = [rng.standard_normal((n, 2, 3)) + 4 for n in (1, 6, 2)]
    for x in xs:
        norma.batch_norm_forward_training(x, running_mean=rm, running_var=rv, momentum=0.3,
                                          running_count=rc)
    n, m, v = _counted_rule([torch.from_numpy(x) for x in xs], 0.3, 2)
    assert rc[0] == pytest.approx(n, rel=1e-12)
    np.testing.assert_allclose(rm, m, rtol=1e-12)
    np.testing.assert_allclose(rv, v, rtol=1e-12)


# ------------------------------------------------------------------------------------------
# Precise statistics
# ------------------------------------------------------------------------------------------


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Conv2d(3, 6, 3, bias=False), nn.BatchNorm2d(6), nn.ReLU(),
                               nn.Dropout(0.5), nn.Conv2d(6, 5, 3), nn.BatchNorm2d(5),
                               nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                               nn.Linear(5, 4), nn.BatchNorm1d(4))

    def forward(self, x):
        return self.f(x)


def _population_inputs(model, batches):
    """Every BN's inputs over the batches, from torch's own layers in training mode (the
    statistics recompute_bn_stats must find), in float64."""
    ref = copy.deepcopy(model)
    got = {}
    hooks = []
    for name, m in ref.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.train()

            def hook(mod, inp, _n=name):
                got.setdefault(_n, []).append(inp[0].detach().double())
            hooks.append(m.register_forward_pre_hook(hook))
    with torch.no_grad():
        for b in batches:
            ref(b)
    out = {}
    for n, xs in got.items():
        x = torch.cat(xs).transpose(0, 1)
        x = x.reshape(x.shape[0], -1)
        out[n] = (x.shape[1], x.mean(1), x.var(1, unbiased=True))
    return out


@pytest.mark.parametrize("convert", [True, False], ids=["norma", "torch-layers"])
def test_recompute_bn_stats_exact(convert):
    torch.manual_seed(0)
    model = _Net()
    if convert:
        model = nt.convert(model)
    model.eval()  # the model's mode is kept for the other layers (Dropout stays off)
    g = _gen(5)
    batches = [torch.randn(5, 3, 8, 8, generator=g) * 3 + 2 for _ in range(4)]
    expect = _population_inputs(model, batches)
    params = {k: v.clone() for k, v in model.named_parameters()}
    nbt = {k: int(v) for k, v in model.named_buffers() if k.endswith("num_batches_tracked")}
    seen = nt.recompute_bn_stats(model, batches, num_batches=3)
    expect3 = _population_inputs(model, batches[:3])
    assert seen == {n: v[0] for n, v in expect3.items()}
    for name, m in model.named_modules():
        if name in expect3:
            _, mean, var = expect3[name]
            np.testing.assert_allclose(m.running_mean.double().numpy(), mean.numpy(),
                                       rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(m.running_var.double().numpy(), var.numpy(),
                                       rtol=1e-5, atol=1e-6)
            assert not m.training
    assert len(expect) == 3
    for k, v in model.named_parameters():
        assert torch.equal(v, params[k]), k
    for k, v in model.named_buffers():
        if k in nbt:
            assert int(v) == nbt[k], k
    assert not model.training
    # batches as (input, target) pairs, through input_of; dict batches are keyword arguments
    pairs = [(b, None) for b in batches[:2]]
    seen2 = nt.recompute_bn_stats(model, pairs, input_of=lambda p: p[0])
    assert seen2["f.1"] == expect3["f.1"][0] * 2 // 3


def test_recompute_bn_stats_closes_the_eval_train_gap():
    """A model whose running statistics come from other data: recompute_bn_stats brings the
    eval-mode output close to the training-mode one (batch statistics) on the data."""
    torch.manual_seed(1)
    model = nt.convert(_Net())
    g = _gen(6)
    with torch.no_grad():
        for _ in range(5):  # statistics of another distribution
            model(torch.randn(8, 3, 8, 8, generator=g))
    data = [torch.randn(16, 3, 8, 8, generator=g) * 2 + 1 for _ in range(4)]
    model.eval()
    with torch.no_grad():
        before = torch.cat([model(b) for b in data])
        model.train()
        model.f[3].eval()  # dropout off, BN in training mode: the batch-statistics output
        train_out = torch.cat([model(b) for b in data])
        model.eval()
        nt.recompute_bn_stats(model, data)
        after = torch.cat([model(b) for b in data])
    gap_before = (before - train_out).abs().mean().item()
    gap_after = (after - train_out).abs().mean().item()
    assert gap_after < 0.5 * gap_before, (gap_before, gap_after)  # 0.79 -> 0.27 here


# ------------------------------------------------------------------------------------------
# Non-finite diagnosis
# ------------------------------------------------------------------------------------------


def _cnn(dtype=torch.float32):
    torch.manual_seed(2)
    return nt.convert(nn.Sequential(nn.Conv2d(3, 4, 1, bias=False), nn.BatchNorm2d(4),
                                    nn.ReLU(), nn.Conv2d(4, 5, 1, bias=False),
                                    nn.BatchNorm2d(5), nn.ReLU(), nn.Flatten(),
                                    nn.Linear(5 * 9, 3), nn.BatchNorm1d(3))).to(dtype)


def test_nonfinite_input_names_layer_sample_channel():
    model = _cnn()
    x = torch.randn(4, 3, 3, 3)
    with torch.no_grad():
        model[0].weight[2, 1] = float("inf")   # the first conv makes Inf in channel 2
    with pytest.raises(nt.NonFiniteError) as ei:
        with nt.detect_nonfinite(model):
            model(x)
    f = ei.value.finding
    assert (f.layer, f.where, f.channel, f.sample) == ("1", "input", 2, 0), str(f)
    assert "already" in f.cause and "inf" in f.value.lower()
    # channels_last: the index the C library reports is mapped the other way
    xl = x.contiguous(memory_format=torch.channels_last)
    m2 = _cnn().to(memory_format=torch.channels_last)
    with torch.no_grad():
        m2[0].weight[3, 0] = float("nan")
    with nt.detect_nonfinite(m2, raise_error=False) as found:
        m2(xl)
    assert found and found.first.channel == 3 and found.first.where == "input"
    assert "NaN" in found.first.cause
    assert "channel 3" in str(found)


def test_nonfinite_parameter_and_statistics():
    model = _cnn()
    with torch.no_grad():
        model[4].weight[1] = float("nan")
    with nt.detect_nonfinite(model, raise_error=False) as found:
        model(torch.randn(4, 3, 3, 3))
    assert (found.first.layer, found.first.where, found.first.channel) == ("4", "weight", 1)
    model = _cnn().eval()
    with torch.no_grad():
        model[1].running_var[0] = -1.0
    with pytest.raises(nt.NonFiniteError, match="negative running variance"):
        with nt.detect_nonfinite(model):
            model(torch.randn(2, 3, 3, 3))
    # hooks and flags are removed afterwards
    assert "forward" not in model[1].__dict__ and model[1].check_finite is False


def test_nonfinite_output_zero_variance_and_f16_overflow():
    bn = nt.BatchNorm2d(3, eps=0.0).eval()
    with torch.no_grad():
        bn.running_var[1] = 0.0
    x = torch.randn(2, 3, 4, 4)
    with pytest.raises(nt.NonFiniteError) as ei:
        with nt.detect_nonfinite(nn.Sequential(bn)):
            nn.Sequential(bn)(x)
    f = ei.value.finding
    assert f.where == "output" and f.channel == 1 and "zero variance with eps = 0" in f.cause
    # float16 activations: a large weight pushes y beyond 65504
    bn16 = nt.BatchNorm2d(3)
    with torch.no_grad():
        bn16.weight[2] = 1e5
    x16 = torch.randn(4, 3, 4, 4).half()
    with pytest.raises(nt.NonFiniteError) as ei:
        with nt.detect_nonfinite(bn16):
            bn16(x16)
    f = ei.value.finding
    assert f.where == "output" and f.channel == 2 and "float16 overflow" in f.cause, str(f)


def test_nonfinite_gradients():
    """A non-finite gradient arriving from the loss is blamed on the layers after the last BN;
    one that a layer makes itself (a nearly constant float16 channel, eps = 0) on that layer."""
    model = _cnn()
    x = torch.randn(4, 3, 3, 3, requires_grad=True)
    with pytest.raises(nt.NonFiniteError) as ei:
        with nt.detect_nonfinite(model):
            out = model(x)
            (out * torch.tensor([1.0, float("inf"), 1.0])).sum().backward()
    f = ei.value.finding
    assert (f.layer, f.where, f.channel) == ("8", "grad_output", 1), str(f)
    assert "arrives non-finite" in f.cause
    bn = nt.BatchNorm2d(2, eps=0.0)
    xs = torch.ones(4, 2, 4, 4)
    xs[:, 0] = torch.randn(4, 4, 4)
    xs[0, 1, 0, 0] = 1.0009765625  # one float16 ulp away: var ~ 6e-8
    xs = xs.half().requires_grad_()
    gy = torch.full((4, 2, 4, 4), 200.0).half()
    gy[1, 1] = -200.0
    with nt.detect_nonfinite(bn, raise_error=False) as found:
        bn(xs).backward(gy)
    assert found, "a float16 overflow of dx was not found"
    f = found.first
    assert f.where == "grad_input" and f.channel == 1 and "var + eps" in f.cause, str(f)


# ------------------------------------------------------------------------------------------
# Adaptive clip of BatchNorm's gradients
# ------------------------------------------------------------------------------------------


def test_adaptive_grad_clip_threshold_follows_ema():
    model = nn.Sequential(nn.Linear(2, 3), nt.BatchNorm1d(3))
    clip = nt.AdaptiveGradClip(model, factor=2.0, alpha=0.5, warmup=1)
    assert clip.params == [model[1].weight, model[1].bias]

    def set_grads(norm):
        model[1].weight.grad = torch.tensor([norm, 0.0, 0.0])
        model[1].bias.grad = torch.zeros(3)
        model[0].weight.grad = torch.full((3, 2), 1e6)  # not a BN parameter: never touched

    # (norm in, norm out, average after): the first step starts the average; then the limit
    # is 2 x the average, and the average follows the norms as clipped
    for g_in, g_out, ema in ((1.0, 1.0, 1.0), (1.5, 1.5, 1.25), (3.0, 2.5, 1.875),
                             (100.0, 3.75, 2.8125)):
        set_grads(g_in)
        assert clip.step() == pytest.approx(g_in)
        assert float(model[1].weight.grad.norm()) == pytest.approx(g_out)
        assert clip.ema == pytest.approx(ema)
    assert clip.clipped == 2 and clip.last_limit == pytest.approx(3.75)
    assert float(model[0].weight.grad[0, 0]) == 1e6
    set_grads(float("nan"))               # skipped: zeroed, the average untouched
    clip.step()
    assert clip.skipped == 1 and float(model[1].weight.grad.abs().sum()) == 0
    assert clip.ema == pytest.approx(2.8125)
    with pytest.raises(ValueError, match="no BatchNorm parameter"):
        nt.AdaptiveGradClip(nn.Linear(2, 2))


# ------------------------------------------------------------------------------------------
# Streaming normalization
# ------------------------------------------------------------------------------------------


def _stream_reference(frames, alpha, eps, weight, bias, state=None):
    """Frame by frame, in float64: the definition of StreamingBatchNorm."""
    out = []
    m = v = None
    if state is not None:
        m, v = state
    for x in frames:
        xc = x.double().reshape(x.shape[0], -1)
        mu, var = xc.mean(1), xc.var(1, unbiased=False)
        if m is None:
            m, v = mu, var
        else:
            m = (1 - alpha) * m + alpha * mu
            v = (1 - alpha) * v + alpha * var
        y = (x.double() - m.view(-1, *[1] * (x.dim() - 1))) / torch.sqrt(
            v.view(-1, *[1] * (x.dim() - 1)) + eps)
        out.append(y * weight.double().view(-1, *[1] * (x.dim() - 1)) +
                   bias.double().view(-1, *[1] * (x.dim() - 1)))
    return torch.stack(out), (m, v)


def test_streaming_batchnorm_definition_state_and_grad():
    torch.manual_seed(3)
    s = nt.StreamingBatchNorm(3, alpha=0.25).double()
    with torch.no_grad():
        s.weight.uniform_(0.5, 1.5)
        s.bias.uniform_(-1, 1)
    frames = torch.randn(7, 3, 4, 5, dtype=torch.float64) * 2 + torch.linspace(
        0, 6, 7, dtype=torch.float64).view(7, 1, 1, 1)   # a drift over time
    ref, state = _stream_reference(frames, 0.25, s.eps, s.weight.detach(), s.bias.detach())
    y1 = s(frames[:3])
    y2 = s(frames[3:])                                   # the state carries over
    torch.testing.assert_close(torch.cat([y1, y2]), ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s.running_mean, state[0], rtol=1e-12, atol=1e-12)
    assert int(s.frames_seen) == 7
    s.reset()
    torch.testing.assert_close(s(frames), ref, rtol=1e-10, atol=1e-10)   # a new stream
    # gradients through the statistics of the frames of the batch
    s.reset()
    x = frames[:4].clone().requires_grad_()

    def f(x, w, b):
        s.reset()
        return nt.StreamingBatchNorm.forward(s, x) * 1.0 + 0 * (w.sum() + b.sum())
    assert torch.autograd.gradcheck(f, (x, s.weight, s.bias), eps=1e-6, atol=1e-6)
    # channels_last in, channels_last out; bfloat16 under autocast
    s32 = nt.StreamingBatchNorm(3)
    xl = frames.float().contiguous(memory_format=torch.channels_last)
    assert s32(xl).is_contiguous(memory_format=torch.channels_last)
    s32.reset()
    yb = s32(xl.bfloat16())
    assert yb.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="alpha"):
        nt.StreamingBatchNorm(3, alpha=0.0)


# ------------------------------------------------------------------------------------------
# Mixed precision, TorchScript, tracing, the backend
# ------------------------------------------------------------------------------------------


def _model():
    torch.manual_seed(4)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
                         nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1, bias=False),
                         nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 6), nn.BatchNorm1d(6))


@pytest.mark.parametrize("fmt", ["contiguous", "channels_last"])
def test_autocast_bfloat16(fmt):
    """Under torch.autocast("cpu", bfloat16) the convolutions give bfloat16 activations; norma's
    layers take them with float32 parameters and statistics, as torch's do."""
    tmodel = _model()
    nmodel = nt.convert(copy.deepcopy(tmodel))
    mf = torch.channels_last if fmt == "channels_last" else torch.contiguous_format
    tmodel, nmodel = tmodel.to(memory_format=mf), nmodel.to(memory_format=mf)
    x = torch.randn(6, 3, 8, 8, generator=_gen(8)).contiguous(memory_format=mf)
    seen = []
    nmodel[1].register_forward_hook(lambda m, i, o: seen.append((i[0].dtype, o.dtype)))
    losses = []
    for model in (tmodel, nmodel):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x).float().square().mean()
        loss.backward()
        losses.append(loss.item())
    assert seen == [(torch.bfloat16, torch.bfloat16)]
    assert nmodel[1].running_mean.dtype == torch.float32
    assert losses[1] == pytest.approx(losses[0], rel=3e-2)
    for (k, p), (_, q) in zip(nmodel.named_parameters(), tmodel.named_parameters()):
        assert p.grad is not None and p.grad.dtype == p.dtype, k
        cos = torch.nn.functional.cosine_similarity(p.grad.flatten(), q.grad.flatten(), 0)
        assert cos > 0.95, (k, float(cos))
    torch.testing.assert_close(nmodel[1].running_mean, tmodel[1].running_mean, rtol=2e-2,
                               atol=2e-2)


def test_torchscript_and_trace(torch_backend):
    model = nt.convert(_model())
    x = torch.randn(4, 3, 8, 8, generator=_gen(9))
    traced = torch.jit.trace(copy.deepcopy(model).eval(), x)
    torch.testing.assert_close(traced(x), model.eval()(x))
    if torch_backend == "ctypes":
        with pytest.raises(RuntimeError, match="TorchScript needs"):
            torch.jit.script(model)
        return
    scripted = torch.jit.script(copy.deepcopy(model))
    torch.testing.assert_close(scripted(x), model(x))
    assert str(scripted.inlined_graph).count("norma::batch_norm") == 3
    # training mode in TorchScript: statistics, counter and gradients as eager
    eager = copy.deepcopy(model).train()
    sm = torch.jit.script(copy.deepcopy(model).train())
    xe = x.clone().requires_grad_()
    xs = x.clone().requires_grad_()
    eager(xe).sum().backward()
    sm(xs).sum().backward()
    torch.testing.assert_close(xs.grad, xe.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sm[1].running_var, eager[1].running_var)
    assert int(sm[1].num_batches_tracked) == 1
    # saved and loaded (the operators must be loaded first: importing norma.torch does it)
    path = os.path.join(REPO, "build", "test_script_%d.pt" % os.getpid())
    try:
        scripted.save(path)
        loaded = torch.jit.load(path)
        torch.testing.assert_close(loaded(x), model.eval()(x))
    finally:
        if os.path.exists(path):
            os.remove(path)


def test_extension_is_used_when_built():
    """The PyTorch operators are used when CMake built them; when it did not, this says so
    (skipped with CMake's reason), so that a run on the ctypes fallback is never mistaken for
    one of the extension."""
    from norma.torch import _ops
    status_file = os.path.join(os.path.dirname(norma._lib.library_path()),
                               "norma_torch_status.txt")
    if not os.path.isfile(status_file):
        pytest.skip("no norma_torch_status.txt beside %s (not a CMake build tree)"
                    % norma._lib.library_path())
    status = dict(line.split("=", 1) for line in open(status_file).read().splitlines()
                  if "=" in line)
    if status.get("built") != "ON":
        pytest.skip("libnorma_torch was not built (%s): norma.torch runs on its ctypes "
                    "binding" % status.get("reason"))
    s = _ops.extension_status()
    assert s["reason"] is None and s["path"], s
    assert int(torch.ops.norma.library_address()) > 0


def test_double_backward_is_an_error_not_a_wrong_answer():
    x = torch.randn(4, 3, 5, dtype=torch.float64, requires_grad=True)
    w = torch.rand(3, dtype=torch.float64, requires_grad=True)
    y = nt.batch_norm(x, None, None, w, None, True)
    (gx,) = torch.autograd.grad((y * y).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice|not differentiable"):
        gx.sum().backward()


def test_fused_residual_of_another_dtype():
    """relu(bn(x) + residual) with a bfloat16 x and a float32 residual (autocast around a
    residual block): the add is torch's, with its type promotion."""
    bn = nt.BatchNorm2d(3, fuse_relu=True)
    ref = nn.BatchNorm2d(3)
    x = torch.randn(4, 3, 5, 5, generator=_gen(10)).bfloat16().requires_grad_()
    r = torch.randn(4, 3, 5, 5, generator=_gen(11)).requires_grad_()
    y = bn(x, r)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, torch.relu(ref(x.detach()).float() + r.detach()), rtol=2e-2,
                               atol=2e-2)
    y.sum().backward()
    assert x.grad.dtype == torch.bfloat16 and r.grad is not None


def test_trace_in_training_mode_counts_batches(torch_backend):
    """A trace of a training-mode model updates the running statistics and the batch counter
    when it runs, as the eager model does."""
    torch.manual_seed(12)
    model = nt.convert(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)))
    ref = copy.deepcopy(model)
    x = torch.randn(4, 3, 6, 6, generator=_gen(13))
    traced = torch.jit.trace(model, x, check_trace=False)   # the trace ran the model once
    for _ in range(2):
        traced(x)
        ref(x)
    assert int(model[1].num_batches_tracked) == 3 and int(ref[1].num_batches_tracked) == 2
    ref(x)
    torch.testing.assert_close(model[1].running_mean, ref[1].running_mean)
