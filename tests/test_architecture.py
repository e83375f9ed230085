"""The layout's promises, checked on the source: no file of comlrl/ over 400 lines, no import
circle among its modules (counting every import: module-level, under ``if TYPE_CHECKING:`` and
inside functions), comlrl/compat/ and comlrl/tasks/ independent of comlrl/trainers/, the
engine (comlrl/engine/) below the families and above the lower layers (but for sharding),
comlrl/compat/ imported by the edge only, every trainer built by the one constructor, and
parts that receive what they use: no trainer, no catch-all, no attribute set from outside.
Each check is shown able to fail on a violation planted by hand."""

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


@pytest.mark.parametrize(
    "package", ["comlrl.compat", "comlrl.tasks", "comlrl.models", "comlrl.rollout", "comlrl.environments"]
)
def test_lower_layers_import_no_trainer(package):
    offenders = {
        name: sorted(i for i in imported if i.startswith("comlrl.trainers"))
        for name, imported in GRAPH.items()
        if name.startswith(package)
    }
    assert not {name: found for name, found in offenders.items() if found}


ENGINE_ALLOWED = {
    "comlrl.tasks": set(),
    "comlrl.algorithms": set(),
    "comlrl.rewards": set(),
    "comlrl.metrics": set(),
    "comlrl.utils": set(),
    # FSDP2 reaches into the models' forwards, LoRA copies, vLLM weight syncs and checkpoint files.
    "comlrl.models": {"comlrl.engine.sharding"},
    "comlrl.rollout": {"comlrl.engine.sharding"},
    "comlrl.checkpoint": {"comlrl.engine.sharding"},
    "comlrl.environments": set(),
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


BELOW_COMPAT = ["comlrl.engine", *sorted(ENGINE_ALLOWED)]
"""The engine and the layers below it: they speak today's language only."""


def test_only_the_edge_imports_compat():
    """comlrl/compat/ translates comlrl 1.4.3 at the edge: the engine and the layers below it
    never import it (their package ``__init__`` files, which export the user-facing names and
    keep 1.4.3's old ones importable, aside); the families' user-facing classes do."""
    offenders = {
        name: sorted(i for i in imported if i.startswith("comlrl.compat"))
        for name, imported in GRAPH.items()
        if any(name.startswith(package + ".") for package in BELOW_COMPAT) and MODULES[name].name != "__init__.py"
    }
    assert len(offenders) > 50 and not {name: found for name, found in offenders.items() if found}


def test_the_compat_check_finds_a_planted_import():
    """An engine module that imports comlrl/compat/ is reported."""
    GRAPH["comlrl.engine.update"] = GRAPH["comlrl.engine.update"] | {"comlrl.compat.fields"}
    try:
        with pytest.raises(AssertionError, match="comlrl.engine.update"):
            test_only_the_edge_imports_compat()
    finally:
        GRAPH["comlrl.engine.update"] -= {"comlrl.compat.fields"}


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


# ------------------------------------------------------------------------------------------
# parts receive what they use: no trainer, no catch-all, no attribute set from outside
# ------------------------------------------------------------------------------------------
UNTYPED = {"Any", "object"}
"""Annotations that say nothing of what a parameter is."""
CATCH_ALL_READS = 3
"""A parameter that says nothing of its type and is read for this many attributes is a bag."""


def says_nothing(annotation: ast.expr | None) -> bool:
    if annotation is None:
        return True
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return annotation.value in UNTYPED
    return isinstance(annotation, ast.Name) and annotation.id in UNTYPED


def narrowed(function: ast.AST) -> dict[str, set[int]]:
    """Per parameter name, the nodes inside ``if isinstance(name, ...):`` branches, where the
    value's type is known."""
    inside: dict[str, set[int]] = {}
    for branch in ast.walk(function):
        if not isinstance(branch, ast.If):
            continue
        for call in ast.walk(branch.test):
            if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "isinstance" and call.args:
                if isinstance(call.args[0], ast.Name):
                    nodes = {id(node) for statement in branch.body for node in ast.walk(statement)}
                    inside.setdefault(call.args[0].id, set()).update(nodes)
    return inside


def catch_alls(source: str) -> list[str]:
    """``function(parameter)`` for every parameter named ``trainer``, and every parameter whose
    annotation says nothing (``Any``, ``object``, none) that the function reads
    ``CATCH_ALL_READS`` or more attributes of (outside ``isinstance`` branches, where its type
    is known)."""
    found = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        arguments = function.args
        untyped = set()
        for argument in arguments.posonlyargs + arguments.args + arguments.kwonlyargs:
            if argument.arg == "trainer":
                found.append(f"{function.name}({argument.arg})")
            elif argument.arg not in ("self", "cls") and says_nothing(argument.annotation):
                untyped.add(argument.arg)
        reads: dict[str, set[str]] = {name: set() for name in untyped}
        known = narrowed(function)
        for node in ast.walk(function):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in reads:
                if id(node) not in known.get(node.value.id, set()):
                    reads[node.value.id].add(node.attr)
        found += [f"{function.name}({name}: {sorted(attrs)})" for name, attrs in reads.items() if len(attrs) >= 3]
    return found


FOREIGN_ATTRIBUTES = {
    # torch: gradients and data of parameters, an autograd function's context, dynamo's config
    "grad", "data", "recompile_limit",
    # transformers: tokenizers' and models' configs
    "pad_token", "eos_token", "model_max_length", "eos_token_id", "pad_token_id", "generation_config",
    # a dropout module's probability (disable_dropout), a function's name, ctypes' signatures
    "p", "__name__", "argtypes",
    # a module's (the old import paths kept alive), a tqdm bar's length
    "__all__", "__doc__", "__getattr__", "total",
    # a reward function's declared range: set_reward_range's documented contract with the user
    "reward_range",
    # ast nodes rewritten by the code task's stub maker
    "body", "decorator_list",
}  # fmt: skip
"""Attributes of objects that are not comlrl's, which the library sets as their owners document."""


def outside_assignments(source: str) -> list[str]:
    """Every ``x.attribute = ...`` (or ``+=``, annotated) whose ``x`` is not ``self`` or ``cls``,
    the attributes of other libraries' objects in ``FOREIGN_ATTRIBUTES`` aside."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            for part in ast.walk(target):
                if not isinstance(part, ast.Attribute) or not isinstance(part.ctx, ast.Store):
                    continue
                owner = part.value
                # ctx: an autograd Function's context, where torch has forward leave state for backward
                if isinstance(owner, ast.Name) and owner.id in ("self", "cls", "ctx"):
                    continue
                if part.attr not in FOREIGN_ATTRIBUTES:
                    found.append(f"line {part.lineno}: {ast.unparse(part)}")
    return found


SANDBOX = "comlrl.tasks.sandbox"
"""Scripts that run in the sandbox's bare interpreter on values of any JSON-able type, which they
dispatch on: no bags there, and no annotations to read."""


def test_no_part_takes_the_trainer_or_a_catch_all():
    """Parts receive typed collaborators (the run, its agents, a config), never the trainer or
    a bag in its place."""
    offenders = {
        name: found
        for name, path in MODULES.items()
        if not name.startswith(SANDBOX) and (found := catch_alls(path.read_text()))
    }
    assert not offenders


def test_no_attribute_is_set_from_outside_its_object():
    """An object's attributes are set by its own methods: no code outside a class assigns them
    (the trainer's among them)."""
    offenders = {name: found for name, path in MODULES.items() if (found := outside_assignments(path.read_text()))}
    assert not offenders


PLANTED_BAGS = {
    "trainer": "def attach(trainer):\n    pass\n",
    "renamed": "def attach(run: Any):\n    run.agents.device(0)\n    run.backend.sync_weights(0)\n    run.learners\n",
    "unannotated": "def step(self, host, items):\n    return host.rollout(host.prompts, items, host.reward)\n",
}


@pytest.mark.parametrize("planted", PLANTED_BAGS.values(), ids=PLANTED_BAGS.keys())
def test_the_catch_all_check_finds_a_planted_one(planted):
    """A parameter named trainer, or a bag under another name (typed Any, or not typed), is reported."""
    assert len(catch_alls(planted)) == 1
    assert catch_alls(planted.replace("Any", "Run").replace("host,", "host: Run,")) == (
        [] if "trainer" not in planted else ["attach(trainer)"]
    )


PLANTED_ASSIGNMENTS = {
    "trainer": "def set_up(trainer, args):\n    trainer.args = args\n",
    "nested": "def swap(run, backend):\n    run.rollout.backend = backend\n",
    "augmented": "def advance(state):\n    state.global_step += 1\n",
}


@pytest.mark.parametrize("planted", PLANTED_ASSIGNMENTS.values(), ids=PLANTED_ASSIGNMENTS.keys())
def test_the_outside_assignment_check_finds_a_planted_one(planted):
    """An attribute set on another object, directly, through a chain or by ``+=``, is reported;
    the same assignment on ``self`` is not."""
    assert len(outside_assignments(planted)) == 1
    own = planted.replace("trainer.", "self.").replace("run.rollout.", "self.").replace("state.", "self.")
    assert outside_assignments(own) == []


# ------------------------------------------------------------------------------------------
# 1.4.3 spoken of in docstrings only, outside compat/
# ------------------------------------------------------------------------------------------
def docstring_lines(tree: ast.Module) -> set[int]:
    """The lines of every docstring: a module's, class's or function's, and an attribute's (a
    string statement right after an assignment)."""
    lines = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        strings = [body[0]] if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef) else []
        strings += [after for before, after in zip(body, body[1:]) if isinstance(before, ast.Assign | ast.AnnAssign)]
        for statement in strings:
            if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
                if isinstance(statement.value.value, str):
                    lines.update(range(statement.lineno, statement.end_lineno + 1))
    return lines


def mentions_outside_docstrings(source: str) -> list[int]:
    """The lines that name comlrl 1.4.3 in code, a comment or a message rather than a docstring."""
    documented = docstring_lines(ast.parse(source))
    return [n for n, line in enumerate(source.splitlines(), 1) if "1.4.3" in line and n not in documented]


def test_outside_compat_1_4_3_is_named_in_docstrings_only():
    """The library knows one language: what comlrl 1.4.3 did is said in docstrings (for
    readers), never in code, comments or messages, which compat/ words (its advice to the
    families' configs: compat/config_advice.py). The package ``__init__`` files, which keep 1.4.3's
    names importable, aside."""
    offenders = {
        name: found
        for name, path in MODULES.items()
        if not name.startswith("comlrl.compat")
        and path.name != "__init__.py"
        and (found := mentions_outside_docstrings(path.read_text()))
    }
    assert not offenders


def test_the_mention_check_finds_a_planted_comment_and_message():
    planted = '"""A module about comlrl 1.4.3."""\nx = 1  # as comlrl 1.4.3 did\nraise ValueError("1.4.3 did")\n'
    assert mentions_outside_docstrings(planted) == [2, 3]
