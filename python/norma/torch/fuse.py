"""Graph-level fusion of norma's BatchNorm with the ReLU (and the residual add) after it.

In a traced model (torch.fx) two patterns become one norma call:

    y = relu(bn(x))                  ->  bn.fuse_relu = True;  y = bn(x)
    y = relu(bn(x) + r)  (or r + ..) ->  bn.fuse_relu = True;  y = bn(x, r)

which saves a pass over the tensor for the ReLU (and one for the add) in the forward, and in
the backward the ReLU's mask and the add's gradient copy: norma's fused kernels compute them
inside the BatchNorm's own passes (docs/api.md, NORMA_BN_RELU / NORMA_BN_ADD_RELU).  The
results are the same to float32 rounding (bn + r is rounded once inside the kernel).

Only norma BatchNorm modules (after convert) are fused, only when the module is called once in
the graph, its output feeds nothing but the ReLU or the add, and the add's output nothing but
the ReLU.  torchvision's ResNets fuse every BatchNorm but the downsample branch's.
"""

import operator

import torch
from torch import nn

from .modules import _NormaBatchNorm

_RELU_FUNCTIONS = (torch.relu, torch.relu_, torch.nn.functional.relu)
_ADD_FUNCTIONS = (operator.add, operator.iadd, torch.add)


def _is_relu(gm, node):
    if node.op == "call_module":
        mod = gm.get_submodule(node.target)
        return type(mod) is nn.ReLU
    if node.op == "call_function" and node.target in _RELU_FUNCTIONS:
        return len(node.args) == 1 and not {k for k in node.kwargs if k != "inplace"}
    if node.op == "call_method" and node.target in ("relu", "relu_"):
        return len(node.args) == 1 and not node.kwargs
    return False


def _is_add(node):
    if node.op == "call_function" and node.target in _ADD_FUNCTIONS:
        return len(node.args) == 2 and not node.kwargs
    if node.op == "call_method" and node.target in ("add", "add_"):
        return len(node.args) == 2 and not node.kwargs
    return False


def fuse_graph(gm):
    """Fuses in place the patterns above in the GraphModule gm; returns how many BatchNorms
    were fused."""
    graph = gm.graph
    calls = {}
    for node in graph.nodes:
        if node.op == "call_module":
            calls[node.target] = calls.get(node.target, 0) + 1
    fused = 0
    for node in list(graph.nodes):
        if node.op != "call_module" or calls.get(node.target) != 1:
            continue
        bn = gm.get_submodule(node.target)
        if not isinstance(bn, _NormaBatchNorm) or bn.fuse_relu or len(node.args) != 1 \
                or node.kwargs or len(node.users) != 1:
            continue
        (user,) = node.users
        if _is_relu(gm, user):
            user.replace_all_uses_with(node)
            graph.erase_node(user)
            bn.fuse_relu = True
            fused += 1
        elif _is_add(user) and len(user.users) == 1:
            (relu,) = user.users
            other = user.args[1] if user.args[0] is node else user.args[0]
            if other is node or not isinstance(other, torch.fx.Node) or not _is_relu(gm, relu):
                continue
            node.args = (node.args[0], other)
            # the residual must exist before the BatchNorm runs: move the call to the add's
            # place (everything it reads is defined there)
            user.prepend(node)
            relu.replace_all_uses_with(node)
            graph.erase_node(relu)
            graph.erase_node(user)
            bn.fuse_relu = True
            fused += 1
    if fused:
        graph.lint()
        gm.recompile()
    return fused


class _Tracer(torch.fx.Tracer):
    """torch.fx's tracer with norma's modules as leaves (called, not traced through), as
    torch.nn's own modules are."""

    def is_leaf_module(self, m, qualname):
        return m.__module__.startswith("norma.") or super().is_leaf_module(m, qualname)


def fuse_bn_relu(model):
    """Traces model with torch.fx and fuses norma's BatchNorms with the ReLU or residual add +
    ReLU after them (see the module docstring).  Returns a torch.fx.GraphModule that keeps the
    model's submodules, parameters and state_dict keys.  The model must already be converted
    (norma.torch.convert) and traceable by torch.fx; raises what symbolic_trace raises
    otherwise."""
    root = model
    graph = _Tracer().trace(root)
    gm = torch.fx.GraphModule(root, graph, root.__class__.__name__)
    fuse_graph(gm)
    gm.train(model.training)
    return gm
