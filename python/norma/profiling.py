"""Profiling helpers for NORMA_TRACE files and torch.profiler traces (see docs/profiling.md).

NORMA_TRACE=path.json makes libnorma write one Chrome / Perfetto trace event per BatchNorm call
(norma_bn_forward_training, _inference, _backward): "X" events with args n, c, spatial, dtype,
layout, flags, isa, threads, bytes (minimum-traffic model), GBps, status.

    python3 -m norma.profiling summary trace.json            # per op and shape: calls, time, GB/s
    python3 -m norma.profiling merge torch_trace.json trace.json -o merged.json

``merge`` puts norma's events into a torch.profiler trace (``prof.export_chrome_trace``), each
inside the norma.torch autograd op that made the call, so that one timeline (Perfetto,
chrome://tracing) shows the whole training step, which BN layer ran when, and its GB/s.
``label_bn_layers(model)`` names the BN layers in the torch trace ("bn:<module name>").
"""

import collections
import json
import statistics
import sys

__all__ = ["load_trace", "summarize", "format_summary", "merge", "layer_table",
           "label_bn_layers", "main"]

# norma event name -> names of the norma.torch autograd ops (torch.profiler) that make it
# The ops of torch's trace that make norma's calls: the operator of libnorma_torch
# (norma::batch_norm, training or inference) and its autograd nodes, or the
# torch.autograd.Functions of the ctypes backend.
_OWNERS = {
    "BatchNormTrainFunction": ("bn_forward_training",),
    "BatchNormEvalFunction": ("bn_forward_inference",),
    "norma::batch_norm": ("bn_forward_training", "bn_forward_inference"),
    "BatchNormTrainFunctionBackward": ("bn_backward",),
    "BatchNormEvalFunctionBackward": ("bn_backward",),
    "torch::autograd::CppNode<norma_torch::BatchNormTrain>": ("bn_backward",),
    "torch::autograd::CppNode<norma_torch::BatchNormEval>": ("bn_backward",),
}


def load_trace(path):
    """The events of a trace file: a JSON array (NORMA_TRACE), or an object with
    "traceEvents" (torch.profiler).  A NORMA_TRACE file of a process that is still running
    (or that was killed) lacks its closing bracket: it is read anyway."""
    with open(path) as f:
        text = f.read()
    try:
        data = json.loads(text)
    except ValueError:
        t = text.rstrip().rstrip(",")
        data = json.loads(t + ("\n]" if t.lstrip().startswith("[") else ""))
    if isinstance(data, dict):
        data = data.get("traceEvents", [])
    return data


def _norma_events(events):
    return [e for e in events if e.get("cat") == "norma" and e.get("ph") == "X"]


def summarize(events):
    """Per (op, n, c, spatial, dtype, layout, flags): calls, total / median microseconds,
    median GB/s, isa and threads.  A list of dicts, the most total time first."""
    groups = collections.OrderedDict()
    for e in _norma_events(events):
        a = e.get("args", {})
        key = (e["name"], a.get("n"), a.get("c"), a.get("spatial"), a.get("dtype"),
               a.get("layout"), a.get("flags"))
        groups.setdefault(key, []).append(e)
    out = []
    for key, evs in groups.items():
        durs = [float(e["dur"]) for e in evs]
        gbps = [float(e["args"].get("GBps", 0.0)) for e in evs]
        a = evs[-1]["args"]
        out.append({
            "op": key[0], "n": key[1], "c": key[2], "spatial": key[3], "dtype": key[4],
            "layout": key[5], "flags": key[6], "calls": len(evs),
            "total_us": sum(durs), "median_us": statistics.median(durs),
            "median_GBps": statistics.median(gbps), "isa": a.get("isa"),
            "threads": a.get("threads"),
            "errors": sum(1 for e in evs if e["args"].get("status") != "NORMA_OK"),
        })
    out.sort(key=lambda r: -r["total_us"])
    return out


def format_summary(rows):
    lines = ["%-21s %-22s %-5s %-14s %5s %6s %10s %10s %7s %s" % (
        "op", "n x c x spatial", "dtype", "layout", "flags", "calls", "total ms", "median us",
        "GB/s", "isa/threads")]
    total = sum(r["total_us"] for r in rows)
    for r in rows:
        lines.append("%-21s %-22s %-5s %-14s %5s %6d %10.2f %10.1f %7.2f %s/%s%s" % (
            r["op"], "%sx%sx%s" % (r["n"], r["c"], r["spatial"]), r["dtype"], r["layout"],
            r["flags"], r["calls"], r["total_us"] / 1e3, r["median_us"], r["median_GBps"],
            r["isa"], r["threads"], ("  %d errors" % r["errors"]) if r["errors"] else ""))
    lines.append("total %.2f ms in %d calls" % (total / 1e3, sum(r["calls"] for r in rows)))
    return "\n".join(lines)


def _owner_kind(name):
    """The norma calls an op of torch's trace can make (a tuple), or None."""
    return _OWNERS.get(name)


def merge(torch_events, norma_events):
    """torch.profiler's events plus norma's, each norma call moved into the torch op that made
    it.  The two clocks have different origins, so the calls are matched by order: the
    norma.torch autograd ops in torch's trace (BatchNormTrainFunction, its Backward,
    BatchNormEvalFunction...) make a sequence of kinds that is found in the sequence of norma's
    calls (which also holds the calls outside the profiled window); among the places where it
    occurs, the one whose timing fits best is taken.  Each matched norma event is then put in its
    op (same pid / tid, so it nests under it in the UI), named "norma:<op>", with the layer name
    of the innermost "bn:<layer>" label around it when label_bn_layers was used.
    Returns (events, matched, unmatched)."""
    t_ev = [e for e in torch_events if e.get("ph") == "X"]
    owners = sorted((e for e in t_ev if _owner_kind(e.get("name", ""))),
                    key=lambda e: float(e["ts"]))
    labels = [e for e in t_ev if str(e.get("name", "")).startswith("bn:")]
    n_ev = sorted(_norma_events(norma_events), key=lambda e: float(e["ts"]))
    if not owners or not n_ev:
        return list(torch_events), 0, len(n_ev)
    kinds = [_owner_kind(o["name"]) for o in owners]
    nk = [e["name"] for e in n_ev]
    L = len(kinds)
    best = None
    for j in range(len(n_ev) - L + 1):
        if any(n not in k for n, k in zip(nk[j:j + L], kinds)):
            continue
        # timing fit: the spread of (op middle - call middle) over the pairs
        d = [float(o["ts"]) + float(o["dur"]) / 2 - float(e["ts"]) - float(e["dur"]) / 2
             for o, e in zip(owners, n_ev[j:j + L])]
        spread = max(d) - min(d)
        if best is None or spread < best[0]:
            best = (spread, j, statistics.median(d))
    if best is None:
        return list(torch_events), 0, len(n_ev)
    _, j, off = best
    out = list(torch_events)
    for o, ev in zip(owners, n_ev[j:j + L]):
        new = dict(ev)
        o0, od, dur = float(o["ts"]), float(o["dur"]), float(ev["dur"])
        # inside its op: where the common offset puts it, clamped to the op's span
        new["ts"] = max(o0, min(float(ev["ts"]) + off, o0 + max(od - dur, 0.0)))
        new["pid"] = o.get("pid")
        new["tid"] = o.get("tid")
        args = dict(ev.get("args", {}))
        # the label around the op (forward: the module's hooks), or inside it (backward)
        lab = [l for l in labels if float(l["ts"]) <= o0 and
               float(l["ts"]) + float(l["dur"]) >= o0 + od] or \
              [l for l in labels if float(l["ts"]) >= o0 and
               float(l["ts"]) + float(l["dur"]) <= o0 + od]
        if lab:
            name = max(lab, key=lambda l: float(l["ts"]))["name"][3:]
            args["layer"] = name[:-len(".backward")] if name.endswith(".backward") else name
        new["args"] = args
        new["name"] = "norma:" + ev["name"]
        out.append(new)
    return out, L, len(n_ev) - L


def layer_table(merged_events):
    """Per layer (from merge()'s output): forward / backward microseconds, GB/s and shape, in
    the order of the forward; a text table."""
    rows = collections.OrderedDict()
    for e in merged_events:
        if not str(e.get("name", "")).startswith("norma:bn_"):
            continue
        a = e.get("args", {})
        layer = a.get("layer", "?")
        r = rows.setdefault(layer, {"shape": "%sx%sx%s %s %s" % (
            a.get("n"), a.get("c"), a.get("spatial"), a.get("dtype"), a.get("layout"))})
        key = "bwd" if e["name"].endswith("backward") else "fwd"
        r[key] = r.get(key, 0.0) + float(e["dur"])
        r[key + "_GBps"] = a.get("GBps")
    lines = ["%-28s %-34s %10s %7s %10s %7s" % ("layer", "n x c x spatial dtype layout",
                                                 "fwd us", "GB/s", "bwd us", "GB/s")]
    for layer, r in rows.items():
        lines.append("%-28s %-34s %10s %7s %10s %7s" % (
            layer, r["shape"], "%.1f" % r["fwd"] if "fwd" in r else "-",
            "%.2f" % r["fwd_GBps"] if "fwd" in r else "-",
            "%.1f" % r["bwd"] if "bwd" in r else "-",
            "%.2f" % r["bwd_GBps"] if "bwd" in r else "-"))
    return "\n".join(lines)


def label_bn_layers(model):
    """Wraps the forward of every BatchNorm module of `model` in
    torch.profiler.record_function("bn:<module name>"), and its backward (the autograd node
    that made the module's output, with either backend of norma.torch, or torch's) in
    "bn:<module name>.backward", so that torch.profiler traces (and merge()) name the layers.
    Returns the hook handles (call .remove() on them to undo)."""
    import torch
    from torch import nn
    handles = []
    for name, m in model.named_modules():
        if not isinstance(m, nn.modules.batchnorm._BatchNorm):
            continue

        def pre(mod, inp, _name=name or type(m).__name__):
            rf = torch.autograd.profiler.record_function("bn:" + _name)
            rf.__enter__()
            mod.__dict__.setdefault("_norma_rf", []).append(rf)

        def post(mod, inp, out, _name=name or type(m).__name__):
            stack = mod.__dict__.get("_norma_rf")
            if stack:
                stack.pop().__exit__(None, None, None)
            if isinstance(out, torch.Tensor) and out.requires_grad and out.grad_fn is not None:
                _label_backward(out, "bn:%s.backward" % _name)

        handles.append(m.register_forward_pre_hook(pre))
        handles.append(m.register_forward_hook(post))
    return handles


def _label_backward(out, label):
    """record_function(label) around the autograd node that made `out`: entered by a hook on
    out's gradient (run just before the node), left by a hook on the node (run just after)."""
    import torch
    open_rf = []

    def enter(grad):
        rf = torch.autograd.profiler.record_function(label)
        rf.__enter__()
        open_rf.append(rf)

    def leave(grad_inputs, grad_outputs):
        if open_rf:
            open_rf.pop().__exit__(None, None, None)

    out.register_hook(enter)
    out.grad_fn.register_hook(leave)


def main(argv=None):
    import argparse
    p = argparse.ArgumentParser(prog="python3 -m norma.profiling",
                                description="NORMA_TRACE files: summary, merge with a "
                                            "torch.profiler trace.")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("summary", help="calls, time and GB/s per op and shape")
    s.add_argument("trace")
    s.add_argument("--json", action="store_true")
    m = sub.add_parser("merge", help="norma's events inside a torch.profiler trace")
    m.add_argument("torch_trace", help="prof.export_chrome_trace(...) output")
    m.add_argument("norma_trace", help="the NORMA_TRACE file of the same run")
    m.add_argument("-o", "--output", required=True)
    args = p.parse_args(argv)
    if args.cmd == "summary":
        rows = summarize(load_trace(args.trace))
        print(json.dumps(rows, indent=1) if args.json else format_summary(rows))
        return 0
    tev = load_trace(args.torch_trace)
    nev = load_trace(args.norma_trace)
    events, matched, unmatched = merge(tev, nev)
    with open(args.output, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    print("%s: %d norma calls placed in torch's trace (%d outside the profiled window)"
          % (args.output, matched, unmatched))
    if matched:
        print(layer_table(events))
    return 0


if __name__ == "__main__":
    sys.exit(main())
