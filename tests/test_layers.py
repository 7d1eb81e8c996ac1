"""The import graph of src/hvdrunner, read from the source (AST, nothing imported): imports
run one way - no cycle, function-local imports included - and the layers keep apart
(the framework-neutral core, the launcher and each framework adapter)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "hvdrunner"


def _module(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every hvdrunner module ``path`` imports, at module level or inside a function."""
    me = _module(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("hvdrunner")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + [base]
                ).strip(".")
            if base.startswith("hvdrunner"):
                out.add(base)
                out |= {f"{base}.{a.name}" for a in node.names}
    return out


def _graph() -> dict[str, set[str]]:
    paths = sorted(PKG.rglob("*.py"))
    modules = {_module(p) for p in paths}
    graph = {}
    for p in paths:
        me = _module(p)
        deps = {d for d in _imports(p) if d in modules and d != me}
        # A package's own __init__ importing its submodules is its public face, not an edge
        # back into a layer.
        graph[me] = {d for d in deps if not (p.name == "__init__.py" and d.startswith(me + "."))}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for d in sorted(graph.get(n, ())):
            # importing a package runs its __init__: an edge to it
            if state.get(d) == 1:
                return stack[stack.index(d) :] + [d]
            if d not in state and (found := visit(d)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_the_import_graph_has_no_cycle():
    graph = _graph()
    assert len(graph) > 50  # the scan saw the package
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph) or [])}"


@pytest.mark.parametrize(
    "layer,forbidden",
    [
        # core's recipe logs params through tracking (framework-neutral since model logging
        # moved to the adapters); tracking imports no core
        ("hvdrunner.core", ("hvdrunner.keras", "hvdrunner.torch", "hvdrunner._launch",
                            "hvdrunner.runner", "hvdrunner.data")),
        # the adapters on one layer; the petastorm drop-in above both (it may use them)
        ("hvdrunner.torch", ("hvdrunner.keras", "hvdrunner.hvd_keras", "hvdrunner.petastorm")),
        ("hvdrunner.keras", ("hvdrunner.torch", "hvdrunner.petastorm", "hvdrunner.hvd_keras")),
        ("hvdrunner._launch", ("hvdrunner.keras", "hvdrunner.torch", "hvdrunner.tracking")),
        # the launch folder's two sides never import each other; backends start ranks
        # (rank.task) and leave the verdict to the driver side
        ("hvdrunner._launch.driver", ("hvdrunner._launch.rank", "hvdrunner._launch.backends")),
        ("hvdrunner._launch.rank", ("hvdrunner._launch.driver", "hvdrunner._launch.backends")),
        ("hvdrunner._launch.backends", ("hvdrunner._launch.driver",)),
        ("hvdrunner.data", ("hvdrunner.keras", "hvdrunner.torch", "hvdrunner.petastorm")),
        ("hvdrunner.tracking", ("hvdrunner.keras", "hvdrunner.torch", "hvdrunner._launch")),
        # petastorm's API over the data layer: its torch feed may use torch's tensor helper
        ("hvdrunner.petastorm", ("hvdrunner.keras", "hvdrunner._launch", "hvdrunner.tracking",
                                 "hvdrunner.runner")),
        # the Horovod engine on torch.distributed: below both adapters and every drop-in,
        # beside nothing of the launcher, tracking or data
        ("hvdrunner.engine", ("hvdrunner.keras", "hvdrunner.torch", "hvdrunner.hvd_keras",
                              "hvdrunner.hvd_torch", "hvdrunner.petastorm", "hvdrunner._launch",
                              "hvdrunner.runner", "hvdrunner.tracking", "hvdrunner.data",
                              "hvdrunner.core")),
        # horovod.tensorflow's drop-in: the engine's names, Keras optimizers through hvd_keras
        ("hvdrunner.hvd_tensorflow", ("hvdrunner.torch", "hvdrunner.hvd_torch",
                                      "hvdrunner._launch", "hvdrunner.runner")),
        # the drop-in is Horovod's names over the engine, nothing else
        ("hvdrunner.hvd_torch", ("hvdrunner.keras", "hvdrunner.torch", "hvdrunner.hvd_keras",
                                 "hvdrunner._launch", "hvdrunner.runner")),
    ],
)  # fmt: skip
def test_layers_keep_apart(layer, forbidden):
    bad = {
        (m, d)
        for m, deps in _graph().items()
        if m == layer or m.startswith(layer + ".")
        for d in deps
        if any(d == f or d.startswith(f + ".") for f in forbidden)
    }
    assert not bad, f"{layer} must not import {forbidden}: {sorted(bad)}"


def test_nothing_reaches_past_the_launch_seam():
    """Outside the launch folder a backend is reached through the chooser and the protocol
    only (``backends``, ``backends.base``): adding one is one module and one line."""
    seam = {"hvdrunner._launch.backends", "hvdrunner._launch.backends.base"}
    bad = {
        (m, d)
        for m, deps in _graph().items()
        if not m.startswith("hvdrunner._launch")
        for d in deps
        if d.startswith("hvdrunner._launch.backends") and d not in seam
    }
    assert not bad, f"imports past the launch seam: {sorted(bad)}"
    backends = {p.stem for p in (PKG / "_launch" / "backends").glob("*.py")}
    assert backends == {"__init__", "base", "barrier", "classic", "connect", "local"}


def test_no_library_module_imports_the_demo_helpers():
    """hvdrunner.examples is the notebooks' (digits, flowers, image tables): the library
    never depends on it."""
    bad = {
        (m, d)
        for m, deps in _graph().items()
        if not m.startswith("hvdrunner.examples")
        for d in deps
        if d.startswith("hvdrunner.examples")
    }
    assert not bad, f"library modules importing the demo helpers: {sorted(bad)}"


def test_the_scan_finds_function_local_imports(tmp_path, monkeypatch):
    # The checker itself: an import inside a function is an edge like any other.
    fake = tmp_path / "hvdrunner" / "a.py"
    fake.parent.mkdir()
    fake.write_text("def f():\n    from hvdrunner import b\n    import hvdrunner.c\n")
    monkeypatch.setattr(__import__(__name__), "SRC", tmp_path)
    assert _imports(fake) >= {"hvdrunner.b", "hvdrunner.c"}
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


#: Framework imports (TensorFlow, Keras, torch and Horovod's layers for them) live in the
#: adapters: keras/, torch/, hvd_keras.py, and the engine (engine/ with engine/tf/,
#: hvd_torch/, hvd_tensorflow.py). The
#: places outside them, and why:
FRAMEWORK_HOMES = {
    # PreparedData.tf_dataset's feed (a public method of the data handle): TensorFlow is
    # imported inside its functions, only when a TensorFlow rank asks for a dataset.
    "hvdrunner.data.tf_feed",
    # petastorm's make_tf_dataset, the TensorFlow half of its converter API.
    "hvdrunner.petastorm.tf_dataset",
    # Mosaic Streaming is a torch IterableDataset whose ranks meet through torch.distributed:
    # its feed is torch's DataLoader (imported inside functions, on ranks reading MDS shards).
    "hvdrunner.streaming.handle",
    "hvdrunner.streaming.world",
}
FRAMEWORKS = ("tensorflow", "torch", "keras", "tf_keras", "horovod.tensorflow", "horovod.torch",
              "horovod.keras", "horovod._keras")  # fmt: skip


def _framework_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        found |= {n for n in names if any(n == f or n.startswith(f + ".") for f in FRAMEWORKS)}
    return found


def test_frameworks_are_imported_only_in_their_adapters():
    adapters = (
        "hvdrunner.keras",
        "hvdrunner.torch",
        "hvdrunner.hvd_keras",
        "hvdrunner.engine",
        "hvdrunner.hvd_torch",
        "hvdrunner.hvd_tensorflow",
    )
    outside = {}
    for path in sorted(PKG.rglob("*.py")):
        module = _module(path)
        if module.startswith(adapters) or module in FRAMEWORK_HOMES:
            continue
        if found := _framework_imports(path):
            outside[module] = sorted(found)
    assert not outside, f"framework imports outside the adapters: {outside}"
    for home in FRAMEWORK_HOMES:  # each exception still needs its framework (or goes)
        assert _framework_imports(SRC / (home.replace(".", "/") + ".py")), home


#: The one module that writes to stdout/stderr itself; everything else speaks through the
#: `hvdrunner` logger or through it (docs/architecture.md: one voice).
CONSOLE = "hvdrunner._console"


def _console_writes(path: Path) -> list[str]:
    """``print(...)``, ``traceback.print_exc()`` and ``sys.std{out,err}.write`` calls."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id == "print":
            out.append(f"{path.name}:{node.lineno}: print")
        elif isinstance(f, ast.Attribute) and f.attr in (
            "print_exc",
            "print_exception",
            "print_stack",
        ):
            out.append(f"{path.name}:{node.lineno}: traceback.{f.attr}")
        elif (isinstance(f, ast.Attribute) and f.attr == "write"
              and isinstance(f.value, ast.Attribute) and f.value.attr in ("stdout", "stderr")):  # fmt: skip
            out.append(f"{path.name}:{node.lineno}: sys.{f.value.attr}.write")
    return out


def test_library_code_has_one_voice():
    found = [w for p in sorted(PKG.rglob("*.py")) if _module(p) != CONSOLE
             for w in _console_writes(p)]  # fmt: skip
    assert not found, f"write through the logger or hvdrunner._console.say: {found}"
