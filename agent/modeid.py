"""The Execution Mode Identifier (after Gaia): a job's mode, decided from its source at deploy time.

It reads the job's module and the modules it imports from its own package (not the agent's platform
modules, which place and drive every job) with `ast`, never importing or running them, and weighs:
- deep-learning imports (torch, transformers, jax, ...; GPU-only libraries such as cupy or triton count
  as device calls);
- explicit device calls: `.cuda()`, `torch.cuda.*`, `.to("cuda")`, `device="cuda"`,
  `torch.device("cuda")`, and their CPU counterparts; a GPU call under a `cuda.is_available()` test is
  guarded (the job has a CPU path);
- tensor-operation density: calls into a deep-learning library, tensor methods and `@`, over all calls;
- model size, where a config dataclass says it (width, layers, vocabulary, context; `--job-arg`
  values override its defaults): about L x (4d^2 + 2 d f) + (V + T) d parameters.

Rules, first match wins:
    no deep-learning library                                     -> cpu
    GPU calls, none guarded and no CPU call                      -> gpu            (cannot run without one)
    GPU calls with a CPU path (guarded, or CPU calls too: mixed) -> gpu_preferred
    model >= GPU_ONLY_PARAMS                                     -> gpu            (too big to progress on a CPU)
    explicit CPU calls only                                      -> cpu_preferred  (pinned by its author)
    density >= DENSE or model >= PREFER_GPU_PARAMS               -> gpu_preferred
    otherwise                                                    -> cpu_preferred
"""
from __future__ import annotations

import ast
import importlib.util
from dataclasses import asdict, dataclass, field
from pathlib import Path

DL_LIBRARIES = {"torch", "tensorflow", "keras", "jax", "flax", "transformers", "peft", "accelerate",
                "deepspeed", "lightning", "pytorch_lightning", "mxnet", "paddle", "onnxruntime", "timm"}
GPU_LIBRARIES = {"cupy", "triton", "pycuda", "tensorrt"}
# The agent's own modules: they place and drive every job, so their device calls are not the job's.
PLATFORM = {"agent.job", "agent.trainer", "agent.config", "agent.modeid", "agent.checkpoint", "agent.site_agent"}
TENSOR_METHODS = {"matmul", "mm", "bmm", "einsum", "softmax", "log_softmax", "view", "reshape", "transpose",
                  "permute", "contiguous", "backward", "sum", "mean", "exp", "log", "sqrt", "split", "chunk",
                  "masked_fill", "unsqueeze", "squeeze", "flatten", "expand", "repeat", "gather", "scatter",
                  "topk", "argmax", "norm", "relu", "gelu", "tanh", "sigmoid", "zero_grad", "step"}
DENSE = 0.3                       # tensor ops per call above which a job is tensor-dense
PREFER_GPU_PARAMS = 100_000       # from here a model's matmuls amortise launching on a device
GPU_ONLY_PARAMS = 1_000_000_000   # from here a CPU cannot make progress in a round
MAX_FILES = 32

WIDTH = ("n_embd", "hidden_size", "d_model", "dim", "width", "embed_dim")
LAYERS = ("n_layer", "num_layers", "num_hidden_layers", "n_layers", "depth")
VOCAB = ("vocab_size",)
CONTEXT = ("block_size", "n_positions", "max_position_embeddings", "context_length", "seq_len")
FFN = ("intermediate_size", "ffn_dim", "d_ff", "n_inner")


class ModeIdError(ValueError):
    """The job's source cannot be found or parsed; one line naming the file and the problem."""


@dataclass(frozen=True)
class ModeReport:
    target: str
    mode: str
    evidence: tuple[str, ...]            # human-readable, the deciding rule first
    files: tuple[str, ...]
    dl_imports: tuple[str, ...]
    gpu_calls: tuple[str, ...]           # "file:line: call"
    cpu_calls: tuple[str, ...]
    guarded_gpu_calls: int
    tensor_ops: int
    calls: int
    density: float
    params: int | None = None            # estimated from a config dataclass; None = the source does not say
    params_from: str = ""
    args: dict = field(default_factory=dict)

    def summary(self) -> str:
        return f"{self.mode}: " + "; ".join(self.evidence)

    def to_json(self) -> dict:
        d = asdict(self)
        d["evidence_summary"] = self.summary()
        return d


def identify(target: str, args: dict | None = None) -> ModeReport:
    """The mode of the job `package.module:factory` (or `path/to/file.py:factory`)."""
    mod, sep, _ = target.partition(":")
    if not sep or not mod:
        raise ModeIdError(f"{target!r}: expected package.module:factory or path/to/file.py:factory")
    if mod.endswith(".py"):
        path = Path(mod)
        if not path.is_file():
            raise ModeIdError(f"{target}: no such file {mod}")
        return analyse([path], target, args or {}, package=None)
    path = _module_file(mod, target)
    return analyse([path], target, args or {}, package=mod.split(".")[0], module=mod)


def _source_of(mod: str) -> Path | None:
    """The file of module `mod`, found from its top-level package's directory: nothing is imported
    (find_spec of a dotted name would import its parents)."""
    top, *rest = mod.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if not rest:
        return Path(spec.origin) if spec.origin and spec.origin.endswith(".py") else None
    for base in spec.submodule_search_locations or ():
        for p in (Path(base, *rest).with_suffix(".py"), Path(base, *rest, "__init__.py")):
            if p.is_file():
                return p
    return None


def _module_file(mod: str, target: str) -> Path:
    path = _source_of(mod)
    if path is None:
        raise ModeIdError(f"{target}: no Python source for module {mod!r}")
    return path


@dataclass
class _Scan:
    dl: set = field(default_factory=set)
    other_imports: set = field(default_factory=set)
    gpu: list = field(default_factory=list)
    cpu: list = field(default_factory=list)
    guarded: int = 0
    tensor_ops: int = 0
    calls: int = 0
    configs: list = field(default_factory=list)   # (name, file, {field: default})
    follow: list = field(default_factory=list)    # modules imported from the job's own package


def analyse(paths: list[Path], target: str, args: dict, package: str | None, module: str | None = None) -> ModeReport:
    scan, seen, files = _Scan(), set(), []
    queue = [(p, module) for p in paths]
    while queue and len(files) < MAX_FILES:
        path, name = queue.pop(0)
        if path in seen:
            continue
        seen.add(path)
        files.append(str(path))
        _scan_file(path, scan, package)
        for dep in scan.follow:
            if dep in PLATFORM or dep == name:
                continue
            if (src := _source_of(dep)) is not None:
                queue.append((src, dep))
        scan.follow.clear()
    return _decide(scan, target, tuple(files), args)


def _scan_file(path: Path, scan: _Scan, package: str | None) -> None:
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ModeIdError(f"{path}: cannot read: {exc}") from None
    try:
        tree = ast.parse(source, filename=str(path))
    except SyntaxError as exc:
        raise ModeIdError(f"{path}:{exc.lineno}:{exc.offset}: cannot parse the job's source: "
                          f"SyntaxError: {exc.msg}") from None
    _Visitor(path.name, scan, package).visit(tree)


class _Visitor(ast.NodeVisitor):
    def __init__(self, fname: str, scan: _Scan, package: str | None):
        self.fname, self.scan, self.package = fname, scan, package
        self.dl_names: set[str] = set()        # local names bound to deep-learning modules or objects
        self.guard_depth = 0

    # imports
    def _imported(self, module: str, bound: str) -> None:
        top = module.split(".")[0]
        if top in DL_LIBRARIES or top in GPU_LIBRARIES:
            self.scan.dl.add(top)
            self.dl_names.add(bound)
            if top in GPU_LIBRARIES:
                self.scan.gpu.append(f"{self.fname}: import {module} (a GPU-only library)")
        else:
            self.scan.other_imports.add(top)
            if self.package and top == self.package:
                self.scan.follow.append(module)

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self._imported(a.name, (a.asname or a.name).split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module:
            return
        for a in node.names:
            self._imported(node.module, a.asname or a.name)
            if self.package and node.module.split(".")[0] == self.package:
                self.scan.follow.append(f"{node.module}.{a.name}")   # `from pkg import module`

    # guards: `if torch.cuda.is_available():` / `x if torch.cuda.is_available() else y`
    def _guarded(self, test: ast.AST, body) -> None:
        g = any(isinstance(n, ast.Attribute) and n.attr in ("is_available", "device_count") for n in ast.walk(test))
        self.visit(test)
        self.guard_depth += g
        for n in body:
            self.visit(n)
        self.guard_depth -= g

    def visit_If(self, node: ast.If) -> None:
        self._guarded(node.test, node.body)
        for n in node.orelse:
            self.visit(n)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self._guarded(node.test, [node.body])
        self.visit(node.orelse)

    # calls
    def _root(self, node: ast.AST) -> str | None:
        while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
            node = node.func if isinstance(node, ast.Call) else node.value
        return node.id if isinstance(node, ast.Name) else None

    def _device_of(self, node: ast.Call) -> str | None:
        f = node.func
        if isinstance(f, ast.Attribute):
            if f.attr == "cuda":
                return "cuda"      # x.cuda()
            if f.attr == "cpu" and not node.args:
                return "cpu"       # x.cpu()
            if isinstance(f.value, ast.Attribute) and f.value.attr == "cuda" and f.attr not in (
                    "is_available", "device_count"):
                return "cuda"      # torch.cuda.synchronize(), torch.cuda.Event(), ...
        named = [k.value for k in node.keywords if k.arg == "device"]
        if isinstance(f, ast.Attribute) and f.attr in ("to", "device") or isinstance(f, ast.Name) and f.id == "device":
            named += node.args[:1]    # x.to("cuda"), torch.device("cuda")
        for v in named:
            if isinstance(v, ast.Constant) and isinstance(v.value, str):
                if v.value.startswith("cuda"):
                    return "cuda"
                if v.value == "cpu":
                    return "cpu"
        return None

    def visit_Call(self, node: ast.Call) -> None:
        self.scan.calls += 1
        dev = self._device_of(node)
        where = f"{self.fname}:{node.lineno}: {_short(node)}"
        if dev == "cuda":
            self.scan.gpu.append(where)
            self.scan.guarded += self.guard_depth > 0
        elif dev == "cpu":
            self.scan.cpu.append(where)
        if self._root(node.func) in self.dl_names or (
                isinstance(node.func, ast.Attribute) and node.func.attr in TENSOR_METHODS):
            self.scan.tensor_ops += 1
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.MatMult):
            self.scan.tensor_ops += 1
            self.scan.calls += 1
        self.generic_visit(node)

    # config dataclasses (model size)
    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        decorated = any("dataclass" in ast.unparse(d) for d in node.decorator_list)
        if decorated:
            defaults = {}
            for st in node.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and isinstance(
                        st.value, ast.Constant) and isinstance(st.value.value, (int, float)):
                    defaults[st.target.id] = st.value.value
            if _pick(defaults, WIDTH) is not None and _pick(defaults, LAYERS) is not None:
                self.scan.configs.append((node.name, self.fname, defaults))
        self.generic_visit(node)


def _short(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 60 else text[:57] + "..."


def _pick(d: dict, names: tuple[str, ...]):
    return next((d[n] for n in names if n in d), None)


def _params(scan: _Scan, args: dict) -> tuple[int | None, str]:
    if not scan.configs:
        return None, ""
    name, fname, defaults = scan.configs[0]
    vals = dict(defaults)
    for k, v in args.items():
        if k in vals:
            try:
                vals[k] = type(vals[k])(v)
            except (TypeError, ValueError):
                pass
    d, n_layers = int(_pick(vals, WIDTH)), int(_pick(vals, LAYERS))
    ffn = int(_pick(vals, FFN) or 4 * d)
    vocab, ctx = int(_pick(vals, VOCAB) or 0), int(_pick(vals, CONTEXT) or 0)
    params = n_layers * (4 * d * d + 2 * d * ffn) + (vocab + ctx) * d
    return params, f"{name} ({fname}): d={d}, L={n_layers}, V={vocab}, T={ctx}"


def _decide(scan: _Scan, target: str, files: tuple[str, ...], args: dict) -> ModeReport:
    density = scan.tensor_ops / max(1, scan.calls)
    params, params_from = _params(scan, args)
    dl = tuple(sorted(scan.dl))
    unguarded = len(scan.gpu) - scan.guarded
    size = "" if params is None else f"~{params / 1e6:.2g} M parameters from {params_from}"
    dens = f"tensor-op density {density:.2f} ({scan.tensor_ops} of {scan.calls} calls)"
    ev: list[str]
    if not dl:
        mode = "cpu"
        others = ", ".join(sorted(scan.other_imports)) or "none"
        ev = [f"no deep-learning library imported (imports: {others})", dens]
    elif scan.gpu and unguarded == len(scan.gpu) and not scan.cpu:
        mode = "gpu"
        ev = [f"explicit GPU calls with no CPU path: {_few(scan.gpu)}", f"imports {', '.join(dl)}", dens]
    elif scan.gpu:
        mode = "gpu_preferred"
        why = (f"{scan.guarded} guarded by cuda.is_available()" if scan.guarded else "") + \
              (f"{'; ' if scan.guarded else ''}CPU calls too: {_few(scan.cpu)}" if scan.cpu else "")
        ev = [f"mixed: GPU calls {_few(scan.gpu)} with a CPU path ({why})", f"imports {', '.join(dl)}", dens]
    elif params is not None and params >= GPU_ONLY_PARAMS:
        mode = "gpu"
        ev = [f"{size}: too large for a CPU to make progress (>= {GPU_ONLY_PARAMS:.0e})", f"imports {', '.join(dl)}"]
    elif scan.cpu:
        mode = "cpu_preferred"
        ev = [f"pinned to the CPU by its author: {_few(scan.cpu)}; no GPU call", f"imports {', '.join(dl)}", dens]
    elif density >= DENSE or (params is not None and params >= PREFER_GPU_PARAMS):
        mode = "gpu_preferred"
        ev = [f"imports {', '.join(dl)}, no explicit device call", dens + (" >= " if density >= DENSE else " < ")
              + f"{DENSE}"]
        if size:
            ev.append(size + (f" >= {PREFER_GPU_PARAMS:,}" if params >= PREFER_GPU_PARAMS else ""))
    else:
        mode = "cpu_preferred"
        ev = [f"imports {', '.join(dl)}, no explicit device call", f"{dens} < {DENSE}"]
        if size:
            ev.append(f"{size} < {PREFER_GPU_PARAMS:,}")
    if size and not any(size in e for e in ev):
        ev.append(size)
    return ModeReport(target, mode, tuple(ev), files, dl, tuple(scan.gpu), tuple(scan.cpu), scan.guarded,
                      scan.tensor_ops, scan.calls, round(density, 3), params, params_from, dict(args))


def _few(items: list[str], n: int = 2) -> str:
    more = f" (+{len(items) - n} more)" if len(items) > n else ""
    return ", ".join(items[:n]) + more
