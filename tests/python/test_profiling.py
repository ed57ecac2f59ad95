"""NORMA_TRACE files and norma.profiling: the trace of a training step (one event per call,
the documented args), summary, merge into a torch.profiler trace with layer names."""

import json
import os
import subprocess
import sys

import pytest

from norma import profiling
from conftest import REPO, PYDIR

SCRIPT = r"""
import sys, torch
from torch import nn
sys.path.insert(0, %(pydir)r)
import norma.torch as nt
from norma.profiling import label_bn_layers
torch.manual_seed(0)
model = nt.convert(nn.Sequential(
    nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
    nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
    nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 16), nn.BatchNorm1d(16)))
label_bn_layers(model)
x = torch.randn(4, 3, 10, 10)
model(x).sum().backward()                       # outside the profiled window
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU]) as prof:
    model(x).square().mean().backward()
prof.export_chrome_trace(%(torch_trace)r)
"""


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("trace")
    norma_trace, torch_trace = str(d / "norma.json"), str(d / "torch.json")
    env = dict(os.environ, NORMA_TRACE=norma_trace)
    r = subprocess.run([sys.executable, "-c", SCRIPT % {"pydir": PYDIR,
                                                        "torch_trace": torch_trace}],
                       env=env, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    return norma_trace, torch_trace


def test_norma_trace_events(traces):
    events = json.load(open(traces[0]))         # a complete JSON array after exit
    origin = events.pop(0)                      # the clock anchor comes first
    assert origin["name"] == "norma_trace_origin" and origin["ph"] == "i"
    assert origin["args"]["unix_time_us"] > 1.6e15
    assert len(events) == 12                    # 3 BNs x (forward + backward) x 2 passes
    names = [e["name"] for e in events]
    assert names.count("bn_forward_training") == 6 and names.count("bn_backward") == 6
    for e in events:
        assert e["ph"] == "X" and e["cat"] == "norma" and e["dur"] >= 0
        a = e["args"]
        for k in ("n", "c", "spatial", "dtype", "layout", "flags", "isa", "threads", "bytes",
                  "GBps", "status"):
            assert k in a, k
        assert a["status"] == "NORMA_OK" and a["dtype"] == "f32"
    assert {(e["args"]["c"], e["args"]["spatial"]) for e in events} == {(8, 100), (16, 1)}


def test_summary_and_truncated_file(traces, tmp_path):
    rows = profiling.summarize(profiling.load_trace(traces[0]))
    assert sum(r["calls"] for r in rows) == 12
    assert {r["op"] for r in rows} == {"bn_forward_training", "bn_backward"}
    text = profiling.format_summary(rows)
    assert "total" in text and "GB/s" in text
    # a process still running has not written the closing bracket yet
    cut = tmp_path / "cut.json"
    cut.write_text(open(traces[0]).read().rstrip().rstrip("]").rstrip())
    assert len([e for e in profiling.load_trace(str(cut)) if e["ph"] == "X"]) == 12
    r = subprocess.run([sys.executable, "-m", "norma.profiling", "summary", traces[0]],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=PYDIR))
    assert r.returncode == 0 and "bn_backward" in r.stdout


def test_merge_names_layers(traces, tmp_path):
    tev = profiling.load_trace(traces[1])
    nev = profiling.load_trace(traces[0])
    events, matched, unmatched = profiling.merge(tev, nev)
    assert (matched, unmatched) == (6, 6)       # the profiled pass; the first was not
    placed = [e for e in events if str(e.get("name", "")).startswith("norma:bn_")]
    layers = [(e["name"], e["args"].get("layer")) for e in placed]
    assert layers == [("norma:bn_forward_training", "1"), ("norma:bn_forward_training", "4"),
                      ("norma:bn_forward_training", "9"), ("norma:bn_backward", "9"),
                      ("norma:bn_backward", "4"), ("norma:bn_backward", "1")]
    owners = [e for e in tev if e.get("name") in profiling._OWNERS]  # either backend
    for e in placed:   # each inside an op of torch's trace, on its thread
        assert any(o["ts"] <= e["ts"] and e["ts"] + e["dur"] <= o["ts"] + o["dur"] + 1e-6 and
                   o["tid"] == e["tid"] for o in owners), e
    table = profiling.layer_table(events)
    assert "4x8x100 f32 channels_first" in table and "16" in table
    out = tmp_path / "merged.json"
    r = subprocess.run([sys.executable, "-m", "norma.profiling", "merge", traces[1], traces[0],
                        "-o", str(out)], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=PYDIR))
    assert r.returncode == 0, r.stderr
    assert "6 norma calls placed" in r.stdout
    assert len(json.load(open(out))["traceEvents"]) == len(events)
