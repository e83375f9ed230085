"""The layout's promises, checked on the source: no file of comlrl/ over 400 lines, no import
circle among its modules (counting every import: module-level, under ``if TYPE_CHECKING:`` and
inside functions), comlrl/compat/ and comlrl/tasks/ independent of comlrl/trainers/, the
engine (comlrl/engine/) below the families and above the lower layers (but for sharding), and
every trainer built by the one constructor."""

import ast
import inspect
from pathlib import Path

import pytest

import comlrl
from comlrl.engine.base import MultiAgentTrainer

PACKAGE = Path(comlrl.__file__).parent
MODULES = {
    ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): path
    for path in sorted(PACKAGE.rglob("*.py"))  # one order on every machine: the same circle reported first
}


def module_imports(name: str, path: Path) -> set[str]:
    """The comlrl modules that module ``name``, read from ``path``, imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return source_imports(name, path.read_text(), package)


def source_imports(name: str, source: str, package: str) -> set[str]:
    """The comlrl modules that ``source``, module ``name`` of ``package``, imports anywhere: at
    module level, under ``if TYPE_CHECKING:`` (a circle that only type checkers follow still ties
    the two modules' designs together) and inside functions (a lazy import is a dependency
    too)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            submodules = {f"{module}.{alias.name}" for alias in node.names} & MODULES.keys()
            found |= submodules or {module}
    return found & MODULES.keys() - {name}


GRAPH = {name: module_imports(name, path) for name, path in MODULES.items()}


def test_no_file_is_over_400_lines():
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > 400}
    assert not long


def test_no_import_circle():
    done, path = set(), []

    def visit(name):
        if name in path:
            raise AssertionError("import circle: " + " -> ".join(path[path.index(name) :] + [name]))
        if name in done:
            return
        path.append(name)
        for imported in GRAPH[name]:
            visit(imported)
        path.pop()
        done.add(name)

    for name in GRAPH:
        visit(name)


@pytest.mark.parametrize("package", ["comlrl.compat", "comlrl.tasks", "comlrl.models", "comlrl.rollout"])
def test_lower_layers_import_no_trainer(package):
    offenders = {
        name: sorted(i for i in imported if i.startswith("comlrl.trainers"))
        for name, imported in GRAPH.items()
        if name.startswith(package)
    }
    assert not {name: found for name, found in offenders.items() if found}


ENGINE_ALLOWED = {
    "comlrl.compat": set(),
    "comlrl.tasks": set(),
    "comlrl.algorithms": set(),
    "comlrl.rewards": set(),
    "comlrl.metrics": set(),
    "comlrl.utils": set(),
    # FSDP2 reaches into the models' forwards, LoRA copies, vLLM weight syncs and checkpoint files.
    "comlrl.models": {"comlrl.engine.sharding"},
    "comlrl.rollout": {"comlrl.engine.sharding"},
    "comlrl.checkpoint": {"comlrl.engine.sharding"},
}


@pytest.mark.parametrize("package", sorted(ENGINE_ALLOWED))
def test_lower_layers_import_no_engine(package):
    """The engine stands above the lower layers: they import none of its modules (sharding, for
    those that handle sharded models, aside)."""
    offenders = {
        name: sorted(i for i in imported if i.startswith("comlrl.engine") and i not in ENGINE_ALLOWED[package])
        for name, imported in GRAPH.items()
        if name == package or name.startswith(package + ".")
    }
    assert not {name: found for name, found in offenders.items() if found}


def test_the_engine_imports_no_family():
    """comlrl/engine/ is the machinery the families share: none of its modules imports comlrl/trainers/."""
    offenders = {
        name: sorted(i for i in imported if i == "comlrl.trainers" or i.startswith("comlrl.trainers."))
        for name, imported in GRAPH.items()
        if name.startswith("comlrl.engine")
    }
    assert len(offenders) >= 17 and not {name: found for name, found in offenders.items() if found}


def test_the_circle_check_finds_one():
    """The check above is not blind: a circle made by hand is reported."""
    GRAPH["comlrl.utils.text"] = GRAPH["comlrl.utils.text"] | {"comlrl.engine.base"}
    try:
        with pytest.raises(AssertionError, match="import circle"):
            test_no_import_circle()
    finally:
        GRAPH["comlrl.utils.text"] -= {"comlrl.engine.base"}


PLANTED = {
    "type_checking": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from comlrl.engine.base import X\n",
    "function": "def later():\n    from comlrl.engine import base\n",
}


@pytest.mark.parametrize("planted", PLANTED.values(), ids=PLANTED.keys())
def test_the_circle_check_sees_imports_for_type_checking_and_in_functions(planted):
    """An import that only type checkers run, or only a call, is read, and the circle it closes
    is reported: comlrl.utils.text's source with such an import of comlrl.engine.base added."""
    source = MODULES["comlrl.utils.text"].read_text() + "\n" + planted
    imported = source_imports("comlrl.utils.text", source, "comlrl.utils")
    assert imported == GRAPH["comlrl.utils.text"] | {"comlrl.engine.base"}
    saved, GRAPH["comlrl.utils.text"] = GRAPH["comlrl.utils.text"], imported
    try:
        # Any circle now runs through the planted edge, wherever the check entered it.
        with pytest.raises(AssertionError, match=r"import circle: .*comlrl\.utils\.text -> comlrl\.engine\.base"):
            test_no_import_circle()
    finally:
        GRAPH["comlrl.utils.text"] = saved


def test_no_trainer_declares_a_constructor():
    """Every trainer takes its arguments through MultiAgentTrainer's one constructor."""

    def trainers(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from trainers(sub)

    found = list(trainers(MultiAgentTrainer))
    assert len(found) >= 12
    assert [cls.__name__ for cls in found if "__init__" in vars(cls) or "train" in vars(cls)] == []
    assert list(inspect.signature(comlrl.IACTrainer).parameters)[:3] == ["agent_model", "critic_model", "tokenizer"]
