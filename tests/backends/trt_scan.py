"""Find every use of a TensorRT attribute, method or enum member in Python source, by reading its
AST with the types of its values inferred (issue 11, section 4, "Static checks").

The scan is a small abstract interpreter over one module: it follows values from where TensorRT
objects enter (``import tensorrt as trt``, Polygraphy's loaders and runner, Polygraphy's callbacks)
through assignments, tuples, lists, dicts, comprehensions, loops, ``with``, calls between the module's
functions and methods (arguments to parameters, returns to callers), instance attributes
(``self.x = ...``) and ``functools.partial``. Each attribute read or written on a TensorRT object is a
*use*, named ``<Class>.<attr>`` (``ILayer.precision``, ``IExecutionContext.execute_async_v3``) or, on the
module, its dotted path (``trt.LayerType.CONVOLUTION``, ``getattr(trt.LayerType, n)`` over a tuple of
names included). A method a class overrides on a TensorRT base class is a use too
(``IProfiler.report_layer_time``). Results the scan cannot type are named ``?<use>``: an attribute on
one of them is reported as ``?<use>.<attr>``, which no table lists, so an untyped path fails loudly
instead of being skipped: give the use its result type in :data:`RESULT`."""
from __future__ import annotations

import ast
from dataclasses import dataclass, field

# The TensorRT classes this scan types values with; a subclass's attributes fall back to its base's.
SUPER = {"IConstantLayer": "ILayer"}

# Result types of the uses whose results are used further (None: a plain Python value). From the
# bindings' return types (TensorRT python/src/infer/pyGraph.cpp, pyCore.cpp).
RESULT: dict[str, str | None] = {
    "INetworkDefinition.get_layer": "ILayer",
    "INetworkDefinition.get_input": "ITensor",
    "ILayer.get_input": "ITensor",
    "ILayer.get_output": "ITensor",
    "ICudaEngine.create_engine_inspector": "IEngineInspector",
    "IExecutionContext.engine": "ICudaEngine",
}

# What Polygraphy's callables return, as this scan's types: ("loader", T) is a loader whose call gives
# T; "arg0" gives back the first argument (a loader wrapping another); a class name is an object.
NETWORK = ("tuple", ("Builder", "INetworkDefinition", "OnnxParser"))
POLYGRAPHY = {
    "polygraphy.backend.trt.NetworkFromOnnxPath": ("loader", NETWORK),
    "polygraphy.backend.trt.SetLayerPrecisions": "arg0",
    "polygraphy.backend.trt.PostprocessNetwork": "arg0",
    "polygraphy.backend.trt.CreateConfig": ("loader", "IBuilderConfig"),
    "polygraphy.backend.trt.EngineBytesFromNetwork": ("loader", "IHostMemory"),
    "polygraphy.backend.trt.EngineFromBytes": ("loader", "ICudaEngine"),
    "polygraphy.backend.trt.TrtRunner": ("poly-object", "TrtRunner"),
}
# The TensorRT objects Polygraphy's objects hold (TrtRunner.activate_impl: self.engine, self.context).
POLYGRAPHY_ATTRS = {"TrtRunner": {"engine": "ICudaEngine", "context": "IExecutionContext"}}
# Polygraphy calls that call back a function of ours: (positional index, keyword) of the callable, and
# the keyword arguments Polygraphy passes it (PostprocessNetwork.call_impl: ``self._func(network=network)``).
CALLBACKS = {"polygraphy.backend.trt.PostprocessNetwork": (1, "func", {"network": "INetworkDefinition"})}

# Functions that return the tensorrt module (core.backends.tensorrt.versions.import_tensorrt), when another
# module imports them.
TRT_FACTORIES = {"import_tensorrt"}
BUILTIN_SEQ = {"list", "tuple", "sorted", "reversed", "set", "frozenset", "iter"}
EMPTY: frozenset = frozenset()


def obj(cls: str) -> frozenset:
    return frozenset({("obj", cls)})


def _as_types(spec) -> frozenset:
    if isinstance(spec, str):
        return obj(spec)
    if spec[0] == "tuple":
        return frozenset({("tuple", tuple(_as_types(s) for s in spec[1]))})
    if spec[0] == "loader":
        return frozenset({("loader", _as_types(spec[1]))})
    return frozenset({tuple(spec)})


@dataclass
class _Func:
    qual: str
    node: ast.FunctionDef
    parent: str | None      # the enclosing function (closures), None at module level
    cls: str | None         # the class it is a method of


@dataclass
class Scan:
    """The uses found: ``{use: {(location, line), ...}}``; location is the function's qualified name."""

    uses: dict[str, set[tuple[str, int]]] = field(default_factory=dict)

    def names(self) -> set[str]:
        return set(self.uses)


class _Analyzer:
    def __init__(self, tree: ast.Module, documented, seeds: dict[str, dict[str, str]] | None, where: str):
        self.tree, self.where, self.documented = tree, where, frozenset(documented)
        self.funcs: dict[str, _Func] = {}
        self.classes: dict[str, dict] = {}   # qual -> {"methods": {name: qual}, "bases": [nodes], "parent": f}
        self.env: dict[str, dict[str, frozenset]] = {"<module>": {}}
        self.returns: dict[str, frozenset] = {}
        self.attrs: dict[str, dict[str, frozenset]] = {}
        self.scan = Scan()
        self.changed = False
        self._collect(tree.body, None, None, "")
        for fname, params in (seeds or {}).items():
            for p, cls in params.items():
                self._bind_name(fname, p, obj(cls))

    # ------------------------------------------------------------------ structure
    def _collect(self, body, parent_func, cls, prefix):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qual = prefix + node.name
                self.funcs[qual] = _Func(qual, node, parent_func, cls)
                self.env.setdefault(qual, {})
                self._collect(node.body, qual, None, qual + ".")
            elif isinstance(node, ast.ClassDef):
                qual = prefix + node.name
                methods = {n.name: f"{qual}.{n.name}" for n in node.body
                           if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
                self.classes[qual] = {"methods": methods, "bases": node.bases, "parent": parent_func, "node": node}
                self.attrs.setdefault(qual, {})
                self._collect(node.body, parent_func, qual, qual + ".")
            elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
                for sub in ("body", "orelse", "finalbody", "handlers"):
                    for child in getattr(node, sub, []):
                        self._collect(getattr(child, "body", [child]) if isinstance(child, ast.ExceptHandler)
                                      else [child], parent_func, cls, prefix)

    def _add(self, table: dict, key: str, types: frozenset) -> None:
        old = table.get(key, EMPTY)
        new = old | types
        if new != old:
            table[key] = new
            self.changed = True

    def _bind_name(self, qual: str, name: str, types: frozenset) -> None:
        self._add(self.env.setdefault(qual, {}), name, types)

    def _record(self, use: str, qual: str, line: int) -> None:
        spot = (self.where + qual, line)
        if spot not in self.scan.uses.get(use, set()):
            self.scan.uses.setdefault(use, set()).add(spot)
            self.changed = True

    # ------------------------------------------------------------------ driver
    def run(self) -> Scan:
        for _ in range(50):
            self.changed = False
            self._stmts(self.tree.body, "<module>")
            for qual, f in list(self.funcs.items()):
                if f.cls is not None:
                    self._method_self(f)
                self._stmts(f.node.body, qual)
            for cqual, c in self.classes.items():
                self._class_bases(cqual, c)
            if not self.changed:
                return self.scan
        raise RuntimeError("the TensorRT attribute scan did not converge")

    def _method_self(self, f: _Func) -> None:
        params = [a.arg for a in (*f.node.args.posonlyargs, *f.node.args.args)]
        if not params:
            return
        static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in f.node.decorator_list)
        klass = any(isinstance(d, ast.Name) and d.id == "classmethod" for d in f.node.decorator_list)
        if not static:
            self._bind_name(f.qual, params[0], frozenset({("class" if klass else "inst", f.cls)}))

    def _class_bases(self, cqual: str, c: dict) -> None:
        scope = c["parent"] or "<module>"
        for base in c["bases"]:
            for atom in self._expr(base, scope):
                if atom[0] == "trt":
                    for name in c["methods"]:
                        if not name.startswith("__"):  # an override TensorRT calls
                            self._record(f"{atom[1].split('.', 1)[1]}.{name}", cqual, c["node"].lineno)

    # ------------------------------------------------------------------ names
    def _lookup(self, name: str, qual: str) -> frozenset:
        while qual is not None:
            if name in self.env.get(qual, {}):
                return self.env[qual][name]
            qual = self.funcs[qual].parent if qual in self.funcs else None
        if name in self.env["<module>"]:
            return self.env["<module>"][name]
        if name in self.funcs and "." not in name:
            return frozenset({("func", name)})
        if name in self.classes:
            return frozenset({("class", name)})
        return EMPTY

    # ------------------------------------------------------------------ statements
    def _stmts(self, body, qual: str) -> None:
        for s in body:
            self._stmt(s, qual)

    def _stmt(self, s, qual: str) -> None:
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):  # analysed on their own
            child = s.name if qual == "<module>" else f"{qual}.{s.name}"
            kind = "class" if isinstance(s, ast.ClassDef) else "func"
            if child in (self.classes if kind == "class" else self.funcs):
                self._bind_name(qual, s.name, frozenset({(kind, child)}))
            return
        if isinstance(s, ast.Assign):
            v = self._expr(s.value, qual)
            for t in s.targets:
                self._assign(t, v, qual)
        elif isinstance(s, ast.AnnAssign):
            if s.value is not None:
                self._assign(s.target, self._expr(s.value, qual), qual)
        elif isinstance(s, ast.AugAssign):
            self._expr(s.value, qual)
            self._expr(s.target, qual)
        elif isinstance(s, ast.Return):
            if s.value is not None:
                self._add(self.returns, qual, self._expr(s.value, qual))
        elif isinstance(s, (ast.If, ast.While)):
            self._expr(s.test, qual)
            self._stmts(s.body, qual)
            self._stmts(s.orelse, qual)
        elif isinstance(s, ast.For):
            self._assign(s.target, self._elements(self._expr(s.iter, qual)), qual)
            self._stmts(s.body, qual)
            self._stmts(s.orelse, qual)
        elif isinstance(s, ast.With):
            for item in s.items:
                v = self._enter(self._expr(item.context_expr, qual))
                if item.optional_vars is not None:
                    self._assign(item.optional_vars, v, qual)
            self._stmts(s.body, qual)
        elif isinstance(s, ast.Try):
            self._stmts(s.body, qual)
            for h in s.handlers:
                self._stmts(h.body, qual)
            self._stmts(s.orelse, qual)
            self._stmts(s.finalbody, qual)
        elif isinstance(s, ast.Import):
            for a in s.names:
                if a.name == "tensorrt":
                    self._bind_name(qual, a.asname or a.name, frozenset({("trt", "trt")}))
        elif isinstance(s, ast.ImportFrom):
            if (s.module or "").startswith("polygraphy"):
                for a in s.names:
                    self._bind_name(qual, a.asname or a.name, frozenset({("poly", f"{s.module}.{a.name}")}))
        else:
            for child in ast.iter_child_nodes(s):
                if isinstance(child, ast.expr):
                    self._expr(child, qual)

    def _assign(self, target, v: frozenset, qual: str) -> None:
        if isinstance(target, ast.Name):
            self._bind_name(qual, target.id, v)
        elif isinstance(target, (ast.Tuple, ast.List)):
            n = len(target.elts)
            for i, elt in enumerate(target.elts):
                part = EMPTY
                for atom in v:
                    if atom[0] == "tuple" and len(atom[1]) == n:
                        part |= atom[1][i]
                    elif atom[0] in ("tuple", "seq"):
                        part |= self._elements(frozenset({atom}))
                self._assign(elt.value if isinstance(elt, ast.Starred) else elt,
                             frozenset({("seq", part)}) if isinstance(elt, ast.Starred) else part, qual)
        elif isinstance(target, ast.Attribute):
            base = self._expr(target.value, qual)
            if target.attr == "__class__":  # Polygraphy's idiom to reach a subclass's attributes
                cast = {("obj", a[1].split(".", 1)[1]) for a in v if a[0] == "trt"}
                if cast and isinstance(target.value, ast.Name):
                    self._bind_name(qual, target.value.id, frozenset(cast))
                return
            self._attribute(base, target.attr, qual, target.lineno)
            for atom in base:
                if atom[0] == "inst":
                    self._add(self.attrs.setdefault(atom[1], {}), target.attr, v)
        elif isinstance(target, ast.Subscript):
            self._expr(target.slice, qual)
            self._expr(target.value, qual)
            if isinstance(target.value, ast.Name):
                self._bind_name(qual, target.value.id, frozenset({("dict", v)}))

    # ------------------------------------------------------------------ expressions
    def _elements(self, types: frozenset) -> frozenset:
        out = EMPTY
        for atom in types:
            if atom[0] == "seq":
                out |= atom[1]
            elif atom[0] == "tuple":
                for part in atom[1]:
                    out |= part
        return out

    def _dict_values(self, types: frozenset) -> frozenset:
        return frozenset().union(*(a[1] for a in types if a[0] == "dict")) if types else EMPTY

    def _enter(self, types: frozenset) -> frozenset:
        out = EMPTY
        for atom in types:
            if atom[0] == "inst" and "__enter__" in self.classes[atom[1]]["methods"]:
                out |= self.returns.get(self.classes[atom[1]]["methods"]["__enter__"], EMPTY)
            else:
                out |= {atom}  # __enter__ returns self (Runner, Stream, DeviceArray, ExitStack)
        return out

    def _expr(self, e, qual: str, prefix: bool = False) -> frozenset:
        if e is None:
            return EMPTY
        if isinstance(e, ast.Name):
            return self._lookup(e.id, qual)
        if isinstance(e, ast.Constant):
            return frozenset({("str", e.value)}) if isinstance(e.value, str) else EMPTY
        if isinstance(e, ast.Attribute):
            return self._attribute(self._expr(e.value, qual, prefix=True), e.attr, qual, e.lineno, prefix)
        if isinstance(e, ast.Call):
            return self._call(e, qual)
        if isinstance(e, ast.Subscript):
            base, index = self._expr(e.value, qual), e.slice
            self._expr(index, qual)
            out = self._dict_values(base)
            for atom in self._results(base):
                if atom[0] == "tuple":
                    if isinstance(index, ast.Constant) and isinstance(index.value, int) and -len(atom[1]) <= index.value < len(atom[1]):
                        out |= atom[1][index.value]
                    else:
                        out |= self._elements(frozenset({atom}))
                elif atom[0] == "seq":
                    out |= atom[1] if not isinstance(index, ast.Slice) else {atom}
            return out
        if isinstance(e, ast.Tuple):
            return frozenset({("tuple", tuple(self._expr(x, qual) for x in e.elts))})
        if isinstance(e, (ast.List, ast.Set)):
            return frozenset({("seq", frozenset().union(*(self._expr(x, qual) for x in e.elts)))})
        if isinstance(e, ast.Dict):
            for k in e.keys:
                self._expr(k, qual)
            return frozenset({("dict", frozenset().union(*(self._expr(v, qual) for v in e.values)))})
        if isinstance(e, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            for gen in e.generators:
                self._assign(gen.target, self._elements(self._expr(gen.iter, qual)), qual)
                for cond in gen.ifs:
                    self._expr(cond, qual)
            if isinstance(e, ast.DictComp):
                self._expr(e.key, qual)
                return frozenset({("dict", self._expr(e.value, qual))})
            return frozenset({("seq", self._expr(e.elt, qual))})
        if isinstance(e, ast.IfExp):
            self._expr(e.test, qual)
            return self._expr(e.body, qual) | self._expr(e.orelse, qual)
        if isinstance(e, ast.BoolOp):
            return frozenset().union(*(self._expr(v, qual) for v in e.values))
        if isinstance(e, ast.NamedExpr):
            v = self._expr(e.value, qual)
            self._assign(e.target, v, qual)
            return v
        if isinstance(e, ast.Starred):
            return self._expr(e.value, qual)
        if isinstance(e, ast.Lambda):
            self._expr(e.body, qual)
            return EMPTY
        for child in ast.iter_child_nodes(e):  # operators, comparisons, f-strings, ...
            if isinstance(child, ast.expr):
                self._expr(child, qual)
        return EMPTY

    def _results(self, types: frozenset) -> frozenset:
        """``types`` with each TensorRT member replaced by its result (a property's value)."""
        out = EMPTY
        for atom in types:
            out |= self._member_result(atom[1]) if atom[0] == "member" else {atom}
        return out

    def _member_result(self, use: str) -> frozenset:
        if use not in RESULT:
            return frozenset({("?", use)})
        return EMPTY if RESULT[use] is None else obj(RESULT[use])

    def _trt_name(self, cls: str, attr: str, documented) -> str:
        c = cls
        while c is not None:
            if f"{c}.{attr}" in documented:
                return f"{c}.{attr}"
            c = SUPER.get(c)
        return f"{cls}.{attr}"

    def _attribute(self, base: frozenset, attr: str, qual: str, line: int, prefix: bool = False) -> frozenset:
        out = EMPTY
        base = self._results(base)
        objs = sorted(a[1] for a in base if a[0] == "obj")
        if objs:  # a union of TensorRT types (an ILayer cast to IConstantLayer): the ones that have it
            names = [self._trt_name(c, attr, RESULT.keys() | self.documented) for c in objs]
            known = [n for n in names if n in self.documented] or names
            for n in known:
                self._record(n, qual, line)
                out |= {("member", n)}
        for atom in base:
            kind = atom[0]
            if kind == "trt":
                path = f"{atom[1]}.{attr}"
                if not prefix:
                    self._record(path, qual, line)
                out |= {("trt", path)}
            elif kind == "?":
                self._record(f"?{atom[1]}.{attr}", qual, line)
                out |= {("?", f"{atom[1]}.{attr}")}
            elif kind == "inst":
                cls = self.classes.get(atom[1], {})
                if attr in cls.get("methods", {}):
                    out |= {("method", cls["methods"][attr])}
                out |= self.attrs.get(atom[1], {}).get(attr, EMPTY)
            elif kind == "class":
                cls = self.classes.get(atom[1], {})
                if attr in cls.get("methods", {}):
                    out |= {("func", cls["methods"][attr])}
            elif kind == "poly":
                out |= {("poly", f"{atom[1]}.{attr}")}
            elif kind == "poly-object" and attr in POLYGRAPHY_ATTRS.get(atom[1], {}):
                out |= obj(POLYGRAPHY_ATTRS[atom[1]][attr])
        return out

    # ------------------------------------------------------------------ calls
    def _bind_call(self, fqual: str, args: list, kwargs: dict, skip_self: bool) -> frozenset:
        f = self.funcs.get(fqual)
        if f is None:
            return EMPTY
        params = [a.arg for a in (*f.node.args.posonlyargs, *f.node.args.args)]
        if skip_self:
            params = params[1:]
        for p, v in zip(params, args):
            self._bind_name(fqual, p, v)
        names = set(params) | {a.arg for a in f.node.args.kwonlyargs}
        for k, v in kwargs.items():
            if k in names:
                self._bind_name(fqual, k, v)
        return self.returns.get(fqual, EMPTY)

    def _call(self, e: ast.Call, qual: str) -> frozenset:
        if isinstance(e.func, ast.Name) and e.func.id == "getattr" and len(e.args) >= 2 and \
                not self._lookup("getattr", qual):
            base = self._expr(e.args[0], qual, prefix=True)
            out = self._expr(e.args[2], qual) if len(e.args) > 2 else EMPTY
            for name in (a[1] for a in self._expr(e.args[1], qual) if a[0] == "str"):
                out |= self._attribute(base, name, qual, e.lineno)
            return out
        fn = self._expr(e.func, qual)
        if isinstance(e.func, ast.Name) and e.func.id in TRT_FACTORIES and not fn:  # imported from the backend
            fn = frozenset({("func-trt",)})
        args = [self._expr(a, qual) for a in e.args]
        kwargs = {k.arg: self._expr(k.value, qual) for k in e.keywords if k.arg}
        out = self._container_call(e, qual, args)
        if isinstance(e.func, ast.Name) and not fn:
            out |= self._builtin(e.func.id, args)
        if isinstance(e.func, ast.Attribute) and e.func.attr == "partial":  # functools.partial(f, ...)
            for atom in (args[0] if args else EMPTY):
                if atom[0] == "func":
                    self._bind_call(atom[1], args[1:], kwargs, False)
                    out |= {("partial", atom[1])}
        for atom in fn:
            kind = atom[0]
            if kind == "func":
                out |= self._bind_call(atom[1], args, kwargs, False)
            elif kind == "func-trt":
                out |= {("trt", "trt")}
            elif kind == "method":
                out |= self._bind_call(atom[1], args, kwargs, True)
            elif kind == "class":
                init = self.classes[atom[1]]["methods"].get("__init__")
                if init:
                    self._bind_call(init, args, kwargs, True)
                out |= {("inst", atom[1])}
            elif kind == "partial":
                out |= self._bind_call(atom[1], args, kwargs, False)
            elif kind == "poly":
                out |= self._polygraphy_call(atom[1], args, kwargs)
            elif kind == "loader":
                out |= atom[1]
            elif kind == "member":
                out |= self._member_result(atom[1])
            elif kind == "?":
                out |= {("?", atom[1] + "()")}
        return out

    def _polygraphy_call(self, q: str, args: list, kwargs: dict) -> frozenset:
        if q in CALLBACKS:
            index, keyword, passed = CALLBACKS[q]
            func = kwargs.get(keyword, args[index] if len(args) > index else EMPTY)
            for atom in func:
                if atom[0] in ("func", "partial"):
                    self._bind_call(atom[1], [], {k: obj(v) for k, v in passed.items()}, False)
        spec = POLYGRAPHY.get(q)
        if spec == "arg0":
            return args[0] if args else EMPTY
        return _as_types(spec) if spec else EMPTY

    def _container_call(self, e: ast.Call, qual: str, args: list) -> frozenset:
        """list.append/extend, dict.update/get/setdefault/values/items/pop, ExitStack.enter_context."""
        if not isinstance(e.func, ast.Attribute):
            return EMPTY
        attr, holder = e.func.attr, e.func.value
        base = self._expr(holder, qual)
        name = holder.id if isinstance(holder, ast.Name) else None
        first = args[0] if args else EMPTY
        if attr == "enter_context":
            return self._enter(first)
        if name and attr in ("append", "add"):
            self._bind_name(qual, name, frozenset({("seq", first)}))
        elif name and attr == "extend":
            self._bind_name(qual, name, frozenset({("seq", self._elements(first))}))
        elif name and attr == "update":
            pairs = self._elements(first)
            values = frozenset().union(*(a[1][1] for a in pairs if a[0] == "tuple" and len(a[1]) == 2)) \
                if pairs else EMPTY
            self._bind_name(qual, name, frozenset({("dict", values | self._dict_values(first))}))
        elif name and attr == "setdefault" and len(args) > 1:
            self._bind_name(qual, name, frozenset({("dict", args[1])}))
        values = self._dict_values(base)
        if attr in ("get", "pop", "setdefault"):
            return values | (args[1] if len(args) > 1 else EMPTY)
        if attr == "values":
            return frozenset({("seq", values)})
        if attr == "items":
            return frozenset({("seq", frozenset({("tuple", (EMPTY, values))}))})
        return EMPTY

    def _builtin(self, name: str, args: list) -> frozenset:
        if name == "enumerate" and args:
            return frozenset({("seq", frozenset({("tuple", (EMPTY, self._elements(args[0])))}))})
        if name == "zip":
            return frozenset({("seq", frozenset({("tuple", tuple(self._elements(a) for a in args))}))})
        if name in BUILTIN_SEQ and args:
            return frozenset({("seq", self._elements(args[0]))})
        if name == "next" and args:
            return self._elements(args[0]) | (args[1] if len(args) > 1 else EMPTY)
        return EMPTY


def scan_source(source: str, documented, seeds: dict[str, dict[str, str]] | None = None, where: str = "") -> Scan:
    """Every TensorRT use in ``source``. ``documented``: the uses the version table lists (to pick, on a
    union of types, the class that has the attribute); ``seeds``: ``{function: {parameter: TensorRT class}}``
    for functions that TensorRT tools call with TensorRT objects (a Polygraphy post-process script's
    ``postprocess(network)``); ``where``: a prefix for the locations."""
    return _Analyzer(ast.parse(source), documented, seeds, where).run()
