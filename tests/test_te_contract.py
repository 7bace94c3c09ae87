"""Contract test: the Transformer Engine API that the TE backend uses exists in the pinned TE.

TE cannot be imported without its CUDA core, so this reads TE's Python source, unpacked by
``scripts/fetch_te_source.py`` into ``.cache/te/<version>/``, with ``ast``; nothing is imported.
What is checked comes from ``te_contract_tables`` (beside this file) and
``tutorial_lib.fp8.te_contract``: every callable in ``TE_API_USED`` accepts the keyword arguments
we pass, every name in ``TE_API_NAMED`` exists, the defaults in ``TE_DEFAULTS_ASSUMED`` hold, the
modules register the parameters ``TE_PARAMETER_NAMES`` copies weights into, and the ``Format``
members exist. A further test checks that the backend's
modules (``te_contract``, ``te_convert``, ``te_policy``) pass TE no keyword that ``TE_API_USED``
does not declare, so the contract grows with the backend. Where TE's Python source carries a
quantizer rule that our own quantizers follow (the NVFP4 reference's Hadamard transform, the
CuTeDSL ``exp2f_rcp`` of MXFP8), the last section reads the rule and runs ours against it.

A missing cache is a failure telling you to run the fetch script, unless ``TUTORIAL_OFFLINE=1``.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import ml_dtypes
import numpy as np
import pytest
import te_contract_tables as tables
import torch

from tutorial_lib.fp8 import te_contract, te_convert, te_policy
from tutorial_lib.fp8.quantizers import NVFP4Quantizer
from tutorial_lib.fp8.quantizers.block import e8m0_quantize_multiplier
from tutorial_lib.fp8.quantizers.fp4 import TE_RHT_SIGNS

ROOT = Path(__file__).resolve().parents[1]
FETCH_SCRIPT = ROOT / "scripts" / "fetch_te_source.py"


def _load_fetch_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fetch_te_source", FETCH_SCRIPT)
    assert spec is not None and spec.loader is not None, FETCH_SCRIPT
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fetch = _load_fetch_script()
VERSIONS = list(fetch.TE_VERSIONS)


# ---- reading TE's source -------------------------------------------------------------------
@dataclass
class Found:
    """A resolved definition: its AST node and the module (dotted name) defining it."""

    node: ast.AST
    module: str


@dataclass
class Params:
    """The parameters a callable accepts: name -> default source (None: no default)."""

    names: dict[str, str | None] = field(default_factory=dict)
    var_keyword: bool = False


class SourceTree:
    """Resolves dotted names in an unpacked package the way Python's imports would."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._cache: dict[str, ast.Module | None] = {}

    def module(self, dotted: str) -> ast.Module | None:
        if dotted not in self._cache:
            base = self.root.joinpath(*dotted.split("."))
            path = next(
                (p for p in (base / "__init__.py", base.with_suffix(".py")) if p.is_file()), None
            )
            self._cache[dotted] = ast.parse(path.read_text(), str(path)) if path else None
        return self._cache[dotted]

    def resolve(self, qualname: str) -> Found | None:
        parts = qualname.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            module = ".".join(parts[:cut])
            if self.module(module) is not None:
                found = self.lookup(module, parts[cut])
                for member in parts[cut + 1 :]:
                    found = self._member(found, member)
                return found
        return None

    def lookup(
        self, module: str, name: str, _seen: frozenset[tuple[str, str]] = frozenset()
    ) -> Found | None:
        """The last top-level binding of ``name`` in ``module``, following imports."""
        tree = self.module(module)
        if tree is None or (module, name) in _seen:
            return None
        seen = _seen | {(module, name)}
        binding: Found | None = None
        stars: list[str] = []
        for stmt in _top_level(tree):
            if isinstance(stmt, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                if stmt.name == name:
                    binding = Found(stmt, module)
            elif isinstance(stmt, ast.ImportFrom):
                source = _absolute(module, stmt, is_package=self._is_package(module))
                for alias in stmt.names:
                    if alias.name == "*":
                        stars.append(source)
                    elif (alias.asname or alias.name) == name:
                        binding = self.lookup(source, alias.name, seen) or self._as_module(
                            f"{source}.{alias.name}"
                        )
            elif isinstance(stmt, ast.Assign | ast.AnnAssign):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    binding = Found(stmt, module)
        if binding is None:
            for source in stars:
                binding = binding or self.lookup(source, name, seen)
        return binding

    def params(self, found: Found) -> Params:
        """Parameters of a function, or of a class's ``__init__`` (dataclass fields included);
        a ``**kwargs`` ``__init__`` also accepts the parameters of its base classes'."""
        node = found.node
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return _function_params(node)
        assert isinstance(node, ast.ClassDef), ast.dump(node)[:80]
        params = Params()
        init = next(
            (s for s in node.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None
        )
        if init is not None:
            params = _function_params(init)
            params.names.pop("self", None)
        elif _is_dataclass(node):
            params.names = {
                s.target.id: (ast.unparse(s.value) if s.value is not None else None)
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            }
        if init is None or params.var_keyword:
            for base in node.bases:
                resolved = self.lookup(found.module, ast.unparse(base).split(".")[-1])
                if resolved is not None and isinstance(resolved.node, ast.ClassDef):
                    inherited = self.params(resolved)
                    params.names = {**inherited.names, **params.names}
                    params.var_keyword = params.var_keyword and inherited.var_keyword
        return params

    def parameter_names(self, found: Found) -> set[str]:
        """Names a module class (or a base class) registers parameters under: the literal first
        argument of ``register_parameter(...)``, or a literal in a list assigned to a
        ``*_names`` attribute (TE's ``Linear`` registers ``self.weight_names[i]``, with
        ``self.weight_names = ["weight"]``)."""
        assert isinstance(found.node, ast.ClassDef), ast.dump(found.node)[:80]
        names: set[str] = set()
        for node in ast.walk(found.node):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "register_parameter"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                names.add(node.args[0].value)
            elif (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.List)
                and any(
                    isinstance(t, ast.Attribute) and t.attr.endswith("_names") for t in node.targets
                )
            ):
                names.update(e.value for e in node.value.elts if isinstance(e, ast.Constant))
        for base in found.node.bases:
            resolved = self.lookup(found.module, ast.unparse(base).split(".")[-1])
            if resolved is not None and isinstance(resolved.node, ast.ClassDef):
                names |= self.parameter_names(resolved)
        return names

    def _member(self, found: Found | None, name: str) -> Found | None:
        if found is None or not isinstance(found.node, ast.ClassDef):
            return None
        for stmt in found.node.body:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else []
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return Found(stmt, found.module)
        return None

    def _is_package(self, module: str) -> bool:
        return self.root.joinpath(*module.split("."), "__init__.py").is_file()

    def _as_module(self, dotted: str) -> Found | None:
        tree = self.module(dotted)
        return Found(tree, dotted) if tree is not None else None


def _top_level(tree: ast.Module) -> list[ast.stmt]:
    """Module-level statements, including those inside top-level ``if``/``try`` blocks."""
    out: list[ast.stmt] = []
    for stmt in tree.body:
        if isinstance(stmt, ast.If | ast.Try):
            blocks = [stmt.body, stmt.orelse] + (
                [h.body for h in stmt.handlers] + [stmt.finalbody]
                if isinstance(stmt, ast.Try)
                else []
            )
            out.extend(s for block in blocks for s in block)
        else:
            out.append(stmt)
    return out


def _absolute(module: str, stmt: ast.ImportFrom, is_package: bool) -> str:
    if not stmt.level:
        return stmt.module or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (stmt.level - 1)]
    return ".".join(base + ([stmt.module] if stmt.module else []))


def _function_params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> Params:
    a = fn.args
    positional = a.posonlyargs + a.args
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults)) + a.defaults
    names = {
        p.arg: (ast.unparse(d) if d is not None else None)
        for p, d in zip(positional, defaults, strict=True)
    }
    for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        names[p.arg] = ast.unparse(d) if d is not None else None
    return Params(names, var_keyword=a.kwarg is not None)


def _is_dataclass(node: ast.ClassDef) -> bool:
    return any("dataclass" in ast.unparse(d) for d in node.decorator_list)


def _same_source(a: str, b: str) -> bool:
    return ast.dump(ast.parse(a, mode="eval")) == ast.dump(ast.parse(b, mode="eval"))


# ---- fixtures --------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=VERSIONS)
def te_tree(request: pytest.FixtureRequest) -> SourceTree:
    version: str = request.param
    if not fetch.is_complete(version):
        message = (
            f"Transformer Engine {version} source is not in {fetch.source_dir(version)}. "
            f"Run `.venv/bin/python scripts/fetch_te_source.py` (make setup does), or set "
            f"{fetch.OFFLINE_ENV}=1 to skip this contract test."
        )
        if os.environ.get(fetch.OFFLINE_ENV) == "1":
            pytest.skip(f"{fetch.OFFLINE_ENV}=1 and no cached TE source: {message}")
        pytest.fail(message)
    return SourceTree(fetch.source_dir(version))


# ---- the contract ----------------------------------------------------------------------------
def test_wheel_carries_the_pytorch_api_source(te_tree: SourceTree) -> None:
    for required in fetch.REQUIRED_FILES:
        assert (te_tree.root / required).is_file(), required


@pytest.mark.parametrize("qualname", sorted(tables.TE_API_USED))
def test_used_callables_accept_our_keywords(te_tree: SourceTree, qualname: str) -> None:
    found = te_tree.resolve(qualname)
    assert found is not None, f"{qualname} does not exist in TE at {te_tree.root.name}"
    params = te_tree.params(found)
    unknown = set(tables.TE_API_USED[qualname]) - set(params.names)
    assert not unknown, f"{qualname} takes no {sorted(unknown)}; it takes {sorted(params.names)}"


@pytest.mark.parametrize("qualname", tables.TE_API_NAMED)
def test_named_api_exists(te_tree: SourceTree, qualname: str) -> None:
    assert te_tree.resolve(qualname) is not None, f"{qualname} is gone from {te_tree.root.name}"


@pytest.mark.parametrize("qualname", sorted(tables.TE_DEFAULTS_ASSUMED))
def test_assumed_defaults_hold(te_tree: SourceTree, qualname: str) -> None:
    found = te_tree.resolve(qualname)
    assert found is not None, qualname
    params = te_tree.params(found)
    for name, expected in tables.TE_DEFAULTS_ASSUMED[qualname].items():
        assert name in params.names, f"{qualname} has no parameter {name!r}"
        actual = params.names[name]
        assert actual is not None and _same_source(actual, expected), (
            f"{qualname}({name}=...) defaults to {actual}, te_contract_tables assumes {expected}"
        )


@pytest.mark.parametrize("qualname", sorted(tables.TE_PARAMETER_NAMES))
def test_modules_register_the_parameters_we_copy_into(te_tree: SourceTree, qualname: str) -> None:
    found = te_tree.resolve(qualname)
    assert found is not None, qualname
    registered = te_tree.parameter_names(found)
    missing = set(tables.TE_PARAMETER_NAMES[qualname]) - registered
    assert not missing, f"{qualname} registers no {sorted(missing)}; it has {sorted(registered)}"


def test_te_gelu_is_the_tanh_approximation(te_tree: SourceTree) -> None:
    """``convert_to_te(fused=True)`` passes ``activation="gelu"`` for GPT-2's tanh GELU. The CUDA
    kernel is not in the wheel; its Python mirrors are: the ``GELU`` op says it computes the
    "tanh" approximation, and LayerNormMLP's ONNX path maps "gelu" to F.gelu(approximate="tanh").
    """
    gelu = te_tree.resolve("transformer_engine.pytorch.ops.basic.activation.GELU")
    assert gelu is not None and isinstance(gelu.node, ast.ClassDef)
    assert '"tanh" approximation' in (ast.get_docstring(gelu.node) or "")
    mlp = te_tree.resolve("transformer_engine.pytorch.LayerNormMLP")
    assert mlp is not None
    onnx_gelu = [
        node.values[i]
        for node in ast.walk(mlp.node)
        if isinstance(node, ast.Dict)
        for i, key in enumerate(node.keys)
        if isinstance(key, ast.Constant) and key.value == "gelu"
    ]
    assert any("approximate='tanh'" in ast.unparse(v) for v in onnx_gelu), "no tanh gelu mapping"


@pytest.mark.parametrize("qualname", sorted(te_contract.TE_ENUM_MEMBERS))
def test_enum_members_exist(te_tree: SourceTree, qualname: str) -> None:
    for member in te_contract.TE_ENUM_MEMBERS[qualname]:
        assert te_tree.resolve(f"{qualname}.{member}") is not None, f"{qualname}.{member}"


def test_delayed_scaling_rejects_pure_e5m2(te_tree: SourceTree) -> None:
    """``te_recipe_kwargs`` refuses E5M2 because TE's ``DelayedScaling`` does."""
    found = te_tree.resolve("transformer_engine.common.recipe.DelayedScaling")
    assert found is not None and isinstance(found.node, ast.ClassDef)
    post_init = next(
        s for s in found.node.body if isinstance(s, ast.FunctionDef) and s.name == "__post_init__"
    )
    assert "Format.E5M2" in ast.unparse(post_init)


def test_resolver_is_not_vacuous(te_tree: SourceTree) -> None:
    """Unknown names and keywords are reported, so passing tests mean something."""
    assert te_tree.resolve("transformer_engine.pytorch.NoSuchModule") is None
    assert te_tree.resolve("transformer_engine.common.recipe.Format.E9M9") is None
    linear = te_tree.resolve("transformer_engine.pytorch.Linear")
    assert linear is not None
    params = te_tree.params(linear)
    assert "no_such_kwarg" not in params.names and not params.var_keyword
    registered = te_tree.parameter_names(linear)
    assert {"weight", "bias"} <= registered and "fc1_weight" not in registered
    assert te_tree.resolve("transformer_engine.pytorch.autocast") is not None


# ---- TE's recipes: fields, scale flags, GPU checks ------------------------------------------
def _trees() -> list[SourceTree]:
    """Every cached TE version's source (failing as ``te_tree`` does when one is missing)."""
    missing = [v for v in VERSIONS if not fetch.is_complete(v)]
    if missing and os.environ.get(fetch.OFFLINE_ENV) == "1":
        pytest.skip(f"{fetch.OFFLINE_ENV}=1 and no cached TE source for {missing}")
    assert not missing, f"TE {missing} not cached: run `.venv/bin/python {FETCH_SCRIPT.name}`"
    return [SourceTree(fetch.source_dir(v)) for v in VERSIONS]


@pytest.mark.parametrize("cls_name", sorted(te_contract.TE_RECIPE_FIELDS))
def test_recipe_fields_are_those_every_cached_te_has(cls_name: str) -> None:
    """``TE_RECIPE_FIELDS`` is exactly the set of dataclass fields (= constructor keywords) that
    the recipe has in every cached TE version; fields of newer versions only are left out."""
    common: set[str] | None = None
    for tree in _trees():
        found = tree.resolve(f"transformer_engine.common.recipe.{cls_name}")
        assert found is not None and isinstance(found.node, ast.ClassDef), cls_name
        assert _is_dataclass(found.node), f"{cls_name} is no longer a dataclass"
        params = tree.params(found)
        assert not params.var_keyword, cls_name
        names = {n for n in params.names if not n.startswith("_")}
        common = names if common is None else common & names
    assert set(te_contract.TE_RECIPE_FIELDS[cls_name]) == common


@pytest.mark.parametrize("cls_name", sorted(te_contract.TE_RECIPE_POWER_2_FLAGS))
def test_scale_flags_reach_modules_only_through_qparams(te_tree: SourceTree, cls_name: str) -> None:
    """Why ``te_recipe`` copies the flag into ``fp8_quant_*``: those are class attributes
    (no annotation, so no constructor field) built from the flag's class default, and TE's
    modules and recipe states read them, not the flag."""
    flag, direct = te_contract.TE_RECIPE_POWER_2_FLAGS[cls_name]
    found = te_tree.resolve(f"transformer_engine.common.recipe.{cls_name}")
    assert found is not None and isinstance(found.node, ast.ClassDef)
    assert flag in te_tree.params(found).names
    class_attrs = {
        t.id: stmt.value
        for stmt in found.node.body
        if isinstance(stmt, ast.Assign)
        for t in stmt.targets
        if isinstance(t, ast.Name)
    }
    for attr in te_contract.TE_RECIPE_QPARAMS:
        value = class_attrs.get(attr)
        assert isinstance(value, ast.Call) and ast.unparse(value.func) == "QParams", attr
        power_2 = {k.arg: ast.unparse(k.value) for k in value.keywords}.get("power_2_scale")
        assert power_2 == (flag if direct else f"not {flag}"), (attr, power_2)
    readers = {  # te.Linear's current-scaling quantizers; the block recipe's quantizer state
        "Float8CurrentScaling": "Linear",
        "Float8BlockScaling": "quantization.Float8BlockScalingRecipeState",
    }
    reader = te_tree.resolve(f"transformer_engine.pytorch.{readers[cls_name]}")
    assert reader is not None, readers[cls_name]
    source = ast.unparse(reader.node)
    assert "fp8_quant_fwd_inp" in source and "power_2_scale" in source
    if cls_name == "Float8BlockScaling":
        assert flag not in source  # the block recipe's state never reads use_f32_scales


def _function_source(tree: SourceTree, module: str, names: tuple[str, ...]) -> str:
    found = [tree.lookup(module, name) for name in names]
    return "\n".join(ast.unparse(f.node) for f in found if f is not None)


@pytest.mark.parametrize("kind", sorted(te_contract.TE_GPU_NEEDS))
def test_gpu_needs_are_tes(te_tree: SourceTree, kind: str) -> None:
    """``TE_GPU_NEEDS[kind]`` holds the numbers TE's ``check_*_support`` tests, and its
    ``te_check`` is the public function returning that check's verdict."""
    need = te_contract.TE_GPU_NEEDS[kind]
    qualname = f"transformer_engine.pytorch.{need.te_check}"
    assert tables.TE_API_USED.get(qualname) == ("return_reason",), qualname
    public = te_tree.resolve(qualname)
    assert public is not None, qualname
    check = f"check_{need.te_check.removeprefix('is_').removesuffix('_available')}_support"
    assert f"return {check}()" in ast.unparse(public.node), (qualname, check)
    module = "transformer_engine.pytorch.quantization"  # 2.20 moved the logic to _compute_*
    logic = _function_source(te_tree, module, (check, "_compute" + check.removeprefix("check")))
    assert logic, check
    for cc in filter(None, (need.min_cc, need.below_cc)):
        assert f"({cc[0]}, {cc[1]})" in logic, (check, cc)
    if need.min_cuda is not None:
        assert f">= {need.min_cuda[0]}.{need.min_cuda[1]}" in logic, check
    recipe = te_policy.TE_RECIPE_SHORT_NAMES[kind]
    assert te_tree.resolve(f"transformer_engine.common.recipe.{recipe}") is not None


# ---- quantizer rules that TE's Python source carries ---------------------------------------
# TE's pure-Python NVFP4 quantizer: experimental/ in TE 2.9, custom_recipes/ since.
_NVFP4_REFERENCES = (
    "transformer_engine.pytorch.custom_recipes.reference_nvfp4",
    "transformer_engine.pytorch.experimental.quantization_nvfp4",
)


def _newest_tree() -> SourceTree:
    """The newest cached TE's source: the version whose rules our quantizers follow."""
    newest = max(VERSIONS, key=lambda v: tuple(int(p) for p in v.split(".")))
    return next(t for t in _trees() if t.root.name == newest)


def _method(cls: Found, name: str) -> ast.FunctionDef:
    assert isinstance(cls.node, ast.ClassDef)
    return next(s for s in cls.node.body if isinstance(s, ast.FunctionDef) and s.name == name)


def test_nvfp4_rht_follows_tes_reference(te_tree: SourceTree) -> None:
    """TE's NVFP4 reference (``NVFP4QuantizerRef._apply_rht``) builds its Hadamard matrix with
    ``get_wgrad_sign_vector``'s signs *in* ``x.dtype`` and multiplies in it, so a BF16 tensor's
    transform is rounded to BF16 before its amax and casts (TE's CUDA kernels do the same).
    Ours: the same signs, and the amax of the BF16-rounded transform."""
    module = next(m for m in _NVFP4_REFERENCES if te_tree.module(m) is not None)
    signs_fn = te_tree.lookup(module, "get_wgrad_sign_vector")
    assert signs_fn is not None, module
    signs = next(n for n in ast.walk(signs_fn.node) if isinstance(n, ast.List))
    assert tuple(ast.literal_eval(signs)) == TE_RHT_SIGNS
    ref = te_tree.lookup(module, "NVFP4QuantizerRef")
    assert ref is not None, module
    apply = _method(ref, "_apply_rht")
    build = next(
        n
        for n in ast.walk(apply)
        if isinstance(n, ast.Call) and ast.unparse(n.func) == "self._build_hadamard_matrix"
    )
    assert ast.unparse(build.args[2]) == "x.dtype"  # the matrix, hence the product, in x's dtype
    assert any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.MatMult) for n in ast.walk(apply))

    g = torch.Generator().manual_seed(3)
    x = (torch.randint(-1024, 1025, (16, 32), generator=g) / 64).to(torch.bfloat16)
    h = np.ones((1, 1))
    while h.shape[0] < 16:
        h = np.block([[h, h], [h, -h]])
    t = np.diag(np.array(ast.literal_eval(signs), dtype=np.float64)) @ h / 4
    y = x.float().numpy().astype(np.float64).reshape(16, 2, 16) @ t  # exact: few bits
    y_bf16 = y.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)
    q = NVFP4Quantizer(role="grad_output", rht=True).quantize(x)
    assert q.amax.item() == np.abs(y_bf16).max() != np.abs(y).max()


def test_mxfp8_multiplier_is_tes_exp2f_rcp() -> None:
    """TE 2.20 ships its CuTeDSL MXFP8 kernels as Python (``common/CuTeDSL/utils.py``), with
    ``exp2f_rcp``: the float32 whose bits are ``(254 - code) << 23``, except the codes its
    loop lists (255: NaN, 254: the subnormal 2^-127, 0: 2^127), the rule of its CUDA
    ``ptx.cuh`` since TE 2.13. ``e8m0_quantize_multiplier`` gives the same for all 256 codes."""
    tree = _newest_tree()
    found = tree.lookup("transformer_engine.common.CuTeDSL.utils", "exp2f_rcp")
    assert found is not None, f"TE {tree.root.name} has no CuTeDSL exp2f_rcp"
    shift = ast.unparse(ast.parse("(Int32(254) - biased_exp) << Int32(FP32_MANTISSA_BITS)"))
    assert shift in ast.unparse(found.node)
    mantissa_bits = tree.lookup("transformer_engine.common.CuTeDSL.utils", "FP32_MANTISSA_BITS")
    assert mantissa_bits is not None and isinstance(mantissa_bits.node, ast.Assign)
    assert ast.literal_eval(mantissa_bits.node.value) == 23
    loop = next(n for n in ast.walk(found.node) if isinstance(n, ast.For))
    special = dict(ast.literal_eval(loop.iter))
    assert set(special) == {0, 254, 255}
    bits = [special.get(c, (254 - c) << 23) for c in range(256)]
    te = np.array(bits, dtype=np.uint32).view(np.float32)
    ours = e8m0_quantize_multiplier(torch.arange(256, dtype=torch.int32).to(torch.uint8))
    np.testing.assert_array_equal(ours.numpy(), te)  # NaN where TE has NaN


# ---- the backend declares everything it passes ----------------------------------------------
_ALIASES = {"te": "transformer_engine.pytorch", "recipe_mod": "transformer_engine.common.recipe"}


def _te_calls(source: str) -> list[tuple[str, set[str], int]]:
    calls = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in _ALIASES
        ):
            qualname = f"{_ALIASES[node.func.value.id]}.{node.func.attr}"
            calls.append((qualname, {k.arg for k in node.keywords if k.arg}, len(node.args)))
    return calls


def test_backend_calls_are_declared() -> None:
    calls = [
        call
        for module in (te_contract, te_convert, te_policy)
        for call in _te_calls(Path(module.__file__).read_text())
    ]
    assert {q for q, _, _ in calls} >= {
        "transformer_engine.pytorch.Linear",
        "transformer_engine.pytorch.LayerNorm",
        "transformer_engine.pytorch.LayerNormLinear",
        "transformer_engine.pytorch.LayerNormMLP",
        "transformer_engine.pytorch.autocast",
        "transformer_engine.common.recipe.DelayedScaling",
    }
    for qualname, keywords, n_positional in calls:
        assert qualname in tables.TE_API_USED, f"{qualname} is called but not declared"
        assert n_positional == 0, f"{qualname} is called with positional arguments"
        undeclared = keywords - set(tables.TE_API_USED[qualname])
        assert not undeclared, f"{qualname} gets undeclared keywords {sorted(undeclared)}"
