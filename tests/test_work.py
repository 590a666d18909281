"""Work (extract/work.py): the tie-breaker among equal launch counts, and the shapes it reads."""
import pytest
import torch
from optimus_egg.extract.graph import serialize
from optimus_egg.extract.work import MACS_PER_ELEMENT, class_shapes, numel, sizes, work
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from optimus_egg import optimize
from optimus_egg.from_fx import from_fx
from optimus_egg.pipeline import known_shapes


@pytest.mark.parametrize("name", ["parallel_mlp", "dcn_v2", "masknet", "interformer"])
def test_shapes_derived_from_the_leaves_are_the_traced_shapes(saturated, name):
    """From the leaves' shapes alone, class_shapes derives the shape of every class that is
    not an opaque template call, through every op the rules build; where FX traced the class
    the two agree."""
    g, _, lw = saturated[name]
    known = known_shapes(lw, g)
    traced = {c: lw.shapes[lw.nodes[i]] for c, i in g.origins.items() if lw.nodes[i] in lw.shapes}

    def opaque(c):  # a leaf, or a value only a template call computes
        ops = {g.nodes[k].op for k in g.classes[c]}
        opaque_items = all(g.nodes[k].op == "item" and any(g.nodes[j].op == "call_multi" for j in
                                                           g.classes[g.nodes[k].children[0]]) for k in g.classes[c])
        return "input" in ops or ops == {"call"} or opaque_items

    derived = class_shapes(g, {c: s for c, s in known.items() if opaque(c)})
    both = [c for c in traced if not opaque(c)]
    assert len(both) > len(traced) // 2 and all(c in derived for c in both), name
    assert all(tuple(derived[c]) == tuple(traced[c]) for c in both), name
    ops = {g.nodes[k].op for c in derived for k in g.classes.get(c, ())}
    assert {"linear", "cat", "item"} <= ops
    # with the traced shapes as well, every tensor class has one but the absent tensor (an
    # optional bias) and stacks of it (the root is a tuple of outputs)
    every = class_shapes(g, known)
    absent = {c for c, ks in g.classes.items() if g.nodes[ks[0]].op == "none"}
    unknown = {c for c in g.classes if c not in every} - absent - {g.root}
    assert all(set(g.values[g.nodes[k].children[0]]) <= absent for c in unknown for k in g.classes[c]), name


class _Linear(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(32, 16)

    def forward(self, x):
        return self.lin(x)


def test_work_counts_elements_moved_and_multiply_adds():
    gm = fx.symbolic_trace(_Linear())
    lw = from_fx(gm, [torch.randn(8, 32)])
    g = serialize(lw.egraph)
    shapes = class_shapes(g, known_shapes(lw, g))
    (lin,) = [n for n in g.nodes.values() if n.op == "linear"]
    moved = 8 * 32 + 16 * 32 + 16 + 8 * 16
    size = sizes(shapes)
    assert work(g, lin, shapes, size, "linear") == moved + 8 * 16 * 32 / MACS_PER_ELEMENT
    assert work(g, lin, shapes, size) == moved
    assert numel([(2, 3), (4,)]) == 10 and numel((2**31, 3)) == 64 * 3


class _PieceOfWhole(nn.Module):
    def forward(self, a, b):
        t = torch.tanh(torch.cat([a, b], 1))
        p0, _ = t.split([4, 12], 1)
        return p0 * 2


def test_equal_launches_prefer_the_choice_that_moves_less():
    """`p0 * 2` on a piece of tanh(cat): one elementwise kernel either way, and the e-graph also
    holds the product of the whole tensor, narrowed after (one node fewer). Work keeps the
    product on the piece: a quarter of the elements."""
    a, b = torch.randn(8, 4), torch.randn(8, 12)
    gm = fx.symbolic_trace(_PieceOfWhole())
    out = optimize(gm, [a, b], budget_s=1.0, strict=True)
    rep = out.meta["optimus_egg"]
    assert rep.matches.get("pointwise-of-split-piece", 0) >= 1
    ShapeProp(out).propagate(a, b)
    (mul,) = [n for n in out.graph.nodes if n.op == "call_function" and "mul" in str(n.target)]
    assert tuple(mul.meta["tensor_meta"].shape) == (8, 4)
    torch.testing.assert_close(out(a, b), gm(a, b))


def test_gemms_inductor_computes_elementwise_on_cpu():
    """The shapes launch_cost prices as elementwise are the ones Inductor's CPU decompositions
    turn into multiplies and a sum: compiled, they launch no extern GEMM."""
    from optimus_egg.extract.launch_cost import elementwise_linear, elementwise_matmul
    from optimus_egg.measure import compile_inductor

    assert elementwise_matmul((1, 8), (8, 1)) and elementwise_matmul((4, 1, 8), (4, 8, 1))
    assert elementwise_matmul((4, 3, 1), (4, 1, 5)) and elementwise_matmul((6, 1), (1, 5))
    assert not elementwise_matmul((1, 8), (8, 2)) and not elementwise_matmul((2, 8), (8, 1))
    assert not elementwise_matmul((1, 8), (8, 1), table="cuda")
    assert elementwise_linear((1, 3), (3, 3), bias=True) and not elementwise_linear((2, 3), (3, 3), bias=True)
    assert not elementwise_linear((1, 3), (3, 3), bias=False) and not elementwise_linear((1, 17), (3, 17), bias=True)

    def f(a, b, c, d, x, w, bias):
        return a @ b, torch.bmm(c, d), torch.nn.functional.linear(x, w, bias)

    gm = fx.symbolic_trace(f)
    args = [torch.randn(1, 8), torch.randn(8, 1), torch.randn(4, 3, 1), torch.randn(4, 1, 5),
            torch.randn(1, 3), torch.randn(3, 3), torch.randn(3)]
    with torch.no_grad():
        assert compile_inductor(gm, args).launches.extern == 0
    args[0] = torch.randn(2, 8)  # [2, 8] @ [8, 1]: a GEMM
    with torch.no_grad():
        assert compile_inductor(fx.symbolic_trace(f), args).launches.extern == 1


def test_batched_matrix_vector_products_are_elementwise_on_cpu():
    """Inductor's CPU bmm lowering computes a batched matrix-vector product (M or N of 1, any
    size) as a multiply and a sum, fused with its neighbours; so does a bias-free
    batched_linear (one bmm), while one with a bias is a baddbmm, always an extern call."""
    from optimus_egg import ops
    from optimus_egg.extract.fusion_cost import fused_launches
    from optimus_egg.extract.launch_cost import elementwise_batched_linear, elementwise_matmul
    from optimus_egg.kernel_order import KERNEL_ORDER
    from optimus_egg.measure import compile_inductor

    assert elementwise_matmul((4, 64, 8), (4, 8, 1)) and elementwise_matmul((4, 1, 8), (4, 8, 64))
    assert not elementwise_matmul((4, 2, 8), (4, 8, 2)) and not elementwise_matmul((4, 1, 8), (4, 8, 1), table="cuda")
    assert elementwise_batched_linear((4, 16, 8), (4, 1, 8), bias=False)
    assert elementwise_batched_linear((4, 1, 8), (4, 8, 8), bias=False)
    assert not elementwise_batched_linear((4, 16, 8), (4, 1, 8), bias=True)
    assert not elementwise_batched_linear((4, 16, 8), (4, 8, 8), bias=False)

    g = fx.Graph()
    a, v, u, m, x, w, b = (g.placeholder(n) for n in "avumxwb")
    outs = [g.call_function(torch.relu, (g.call_function(torch.bmm, (a, v)),)),
            g.call_function(torch.relu, (g.call_function(torch.bmm, (u, m)),)),
            g.call_function(torch.relu, (g.call_function(ops.batched_linear, (x, w, None)),)),
            g.call_function(torch.relu, (g.call_function(ops.batched_linear, (x, w, b)),))]
    g.output(tuple(outs))
    gm = fx.GraphModule(torch.nn.Module(), g)
    args = [torch.randn(4, 64, 8), torch.randn(4, 8, 1), torch.randn(4, 1, 8), torch.randn(4, 8, 64),
            torch.randn(4, 16, 8), torch.randn(4, 1, 8), torch.randn(4, 1)]
    shapes = {n: tuple(t.shape) for n, t in zip(g.find_nodes(op="placeholder"), args)}
    with torch.no_grad():  # compiled as the backend compiles (the estimate counts its kernel order)
        measured = compile_inductor(gm, args, config_patches=KERNEL_ORDER).launches
    assert measured.extern == 1  # the baddbmm
    assert fused_launches(gm, shapes.get) == measured.total
    assert fused_launches(gm) == 5  # without shapes: four extern calls, then their relus in one kernel
