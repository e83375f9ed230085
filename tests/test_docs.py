"""The documentation site (``docs/``, built by ``mkdocs.yml``) and every example in it and in
README.md. Writers' conventions, also in docs/contributing.md:

- Every fenced ``python`` block runs. The blocks of one page run in page order in one
  namespace (like a notebook's cells), in a fresh temporary working folder.
- Models are cheap here: ``COMLRL_CACHE`` points at a folder whose embedded-model entry is a
  tiny random Llama with a byte-level tokenizer, so ``default_model_path()`` gives it, and a
  hub id (``"Qwen/Qwen2.5-0.5B"``) given to ``AutoModelForCausalLM`` / ``AutoTokenizer``
  ``.from_pretrained`` loads that same tiny model. W&B runs with ``WANDB_MODE=disabled``.
- Sizes are cut: every config a block builds keeps the values it was checked with, then is
  cut to ``CUTS`` (one epoch, a few tokens, two generations, ...), so a page's training
  runs take seconds. A block is written as a user would write it, at real sizes.
- ``<!-- not-run: REASON -->`` on the line before a block (a GPU, torchrun, vLLM, a file
  the reader has) keeps it from running; it is still compiled, its ``comlrl`` imports must
  resolve, and each call of a comlrl class, function or method (also through a variable
  assigned from a comlrl class) must fit the real signature: every keyword argument and the
  number of positional ones. Runnable blocks get the same check before they run.
- ``bash`` blocks are not run: a ``python``/``torchrun`` command that names a script of
  ``examples/`` or ``benchmarks/`` needs that script, and each ``--flag`` it passes must be
  defined there; ``python -m comlrl...`` must name a module; ``make X`` a Makefile target.
- ``<!-- fields: SomeConfig -->`` before a table: every backticked name in the table's first
  column must be a field of that config class. Anywhere in prose, a backticked
  ``name=value`` must name a config field or an argument of a public comlrl callable (or one
  of ``OTHER_NAMES``, documented keyword arguments of other libraries).
- The API reference (``docs/reference/``) has a ``::: path`` entry for every name in every
  comlrl package's ``__all__``, and ``mkdocs build --strict`` passes (no broken link or
  reference, no griffe warning).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import os
import pkgutil
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import comlrl
from comlrl.engine.config import TrainerConfig
from comlrl.models.embedded import MODEL_NAME

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]

CUTS = {
    "num_train_epochs": 1,
    "max_new_tokens": 8,
    "num_generations": 2,
    "preference_num_candidates": 4,
    "preference_pairs_per_sample": 2,
    "comparator_num_candidates": 4,
    "num_iterations": 2,
    "reward_num_train_epochs": 1,
    "eval_num_samples": 2,
}
"""Upper bounds set on every config a block builds (after its own checks passed)."""

OTHER_NAMES = {
    "min_new_tokens",  # a Hugging Face generate argument, through generation_kwargs
    "weights_only",  # torch.load(weights_only=True)
    "merge_adapters",
}
"""Keyword names of other libraries that the docs name as ``name=value``."""

NOT_RUN = re.compile(r"^\s*<!--\s*not-run:\s*(.+?)\s*-->")
FIELDS = re.compile(r"^\s*<!--\s*fields:\s*([\w, ]+?)\s*-->")


# ------------------------------------------------------------------------------ reading pages
@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    not_run: str | None  # the reason, for a block marked not-run


def blocks(page: Path) -> list[Block]:
    """The page's fenced code blocks, with the not-run marker of the line before each."""
    lines = page.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = re.match(r"^(\s*)(```+|~~~+)\s*([\w+-]*)", lines[i])
        if not opening:
            i += 1
            continue
        indent, fence, lang = opening.groups()
        start, body = i, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marker = NOT_RUN.search(before)
        found.append(Block(page, start + 1, lang.lower(), "\n".join(body) + "\n", marker and marker.group(1)))
        i += 1
    return found


def prose(page: Path) -> str:
    """The page without its code blocks (and without snippet-included files)."""
    return re.sub(r"^(\s*)(```+|~~~+).*?^\1\2\s*$", "", page.read_text(), flags=re.S | re.M)


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


# ------------------------------------------------------------------------------ the tiny model
def tiny_tokenizer():
    """A byte-level tokenizer (encodes any text), eos = pad = the embedded model's EOS, and a
    ChatML chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from comlrl.models.embedded import EOS_TOKEN

    symbols = ["<unk>", EOS_TOKEN] + sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={s: i for i, s in enumerate(symbols)}, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", eos_token=EOS_TOKEN, pad_token=EOS_TOKEN
    )
    tokenizer.chat_template = CHATML  # as the embedded SmolLM2's: chat-format examples render
    return tokenizer


CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory):
    """A model cache whose embedded-model folder holds a tiny random Llama."""
    from tests.helpers import tiny_llama

    cache = tmp_path_factory.mktemp("comlrl-cache")
    tokenizer = tiny_tokenizer()
    tiny_llama(tokenizer).save_pretrained(cache / MODEL_NAME)
    tokenizer.save_pretrained(cache / MODEL_NAME)
    return cache


def cut(config) -> None:
    for name, most in CUTS.items():
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > most:
            object.__setattr__(config, name, most)


def config_classes() -> list[type]:
    classes, todo = [], [TrainerConfig]
    while todo:
        cls = todo.pop()
        classes.append(cls)
        todo.extend(cls.__subclasses__())
    return classes


@pytest.fixture
def docs_world(tiny_cache, monkeypatch, tmp_path):
    """The environment blocks run in: tiny models, cut sizes, W&B disabled, a fresh folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from comlrl.models.folders import looks_like_path

    monkeypatch.setenv("COMLRL_CACHE", str(tiny_cache))
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.chdir(tmp_path)
    tiny = str(tiny_cache / MODEL_NAME)

    def redirected(original):
        def from_pretrained(name, *args, **kwargs):
            if isinstance(name, str) and not os.path.exists(os.path.expanduser(name)) and not looks_like_path(name):
                name = tiny  # a hub id
            return original(name, *args, **kwargs)

        return staticmethod(from_pretrained)

    for auto in (AutoModelForCausalLM, AutoTokenizer):
        monkeypatch.setattr(auto, "from_pretrained", redirected(auto.from_pretrained))

    for cls in config_classes():
        init = cls.__dict__["__init__"]

        def cut_init(self, *args, __init=init, **kwargs):
            __init(self, *args, **kwargs)
            cut(self)

        monkeypatch.setattr(cls, "__init__", cut_init)
    yield tmp_path
    # A block's W&B run (disabled mode) leaves wandb's process-wide settings behind; later
    # tests that start a real offline run need them cleared.
    if "wandb" in sys.modules:
        sys.modules["wandb"].teardown()


# ------------------------------------------------------------------------------ signatures
def public_objects() -> dict[str, object]:
    """Every name in the ``__all__`` of comlrl and of each of its packages, by full path."""
    found = {}
    for info in [None, *pkgutil.walk_packages(comlrl.__path__, "comlrl.")]:
        name = "comlrl" if info is None else info.name
        if info is not None and not info.ispkg:
            continue
        module = importlib.import_module(name)
        for export in getattr(module, "__all__", []):
            found[f"{name}.{export}"] = getattr(module, export)
    return found


def parameter_names(obj) -> set[str]:
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return set()
    return {p.name for p in signature.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def known_names() -> set[str]:
    """Config fields and the arguments of every public callable and of its public methods."""
    names = set(OTHER_NAMES)
    for obj in public_objects().values():
        if dataclasses.is_dataclass(obj):
            names |= {f.name for f in dataclasses.fields(obj)}
        if callable(obj):
            names |= parameter_names(obj)
        if inspect.isclass(obj):
            for attribute, member in inspect.getmembers(obj):
                if not attribute.startswith("_") and callable(member):
                    names |= parameter_names(member)
    return names


def is_comlrl(obj) -> bool:
    module = obj.__name__ if inspect.ismodule(obj) else getattr(obj, "__module__", None) or ""
    return module == "comlrl" or module.startswith("comlrl.")


class CallChecker(ast.NodeVisitor):
    """Checks each call of a comlrl callable in ``tree`` against its signature.

    Names resolve through ``namespace`` (the page's, plus the block's own imports); a
    variable assigned from a comlrl class (``trainer = MAGRPOTrainer(...)``) stands for an
    instance of it, so ``trainer.train(...)`` is checked against ``MAGRPOTrainer.train``.
    """

    def __init__(self, namespace: dict):
        self.namespace = namespace
        self.instances: dict[str, type] = {}
        self.problems: list[str] = []

    def resolve(self, node):
        if isinstance(node, ast.Name):
            if node.id in self.instances:
                return ("instance", self.instances[node.id])
            return ("object", self.namespace[node.id]) if node.id in self.namespace else None
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            if base is None:
                return None
            kind, target = base
            if not hasattr(target, node.attr):
                # an instance may have attributes its class lacks; a comlrl module or class may not
                if kind == "object" and is_comlrl(target):
                    self.problems.append(f"{ast.unparse(node)}: {target.__name__} has no {node.attr!r}")
                return None
            attribute = getattr(target, node.attr)
            if kind == "instance" and inspect.isfunction(attribute):
                return ("method", attribute)
            return ("object", attribute)
        return None

    def visit_Assign(self, node):
        self.generic_visit(node)
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Call):
            resolved = self.resolve(node.value.func)
            if resolved and resolved[0] == "object" and inspect.isclass(resolved[1]) and is_comlrl(resolved[1]):
                self.instances[node.targets[0].id] = resolved[1]
            else:
                self.instances.pop(node.targets[0].id, None)

    def visit_Call(self, node):
        self.generic_visit(node)
        resolved = self.resolve(node.func)
        if resolved is None:
            return
        kind, target = resolved
        if kind == "instance" or not callable(target) or not is_comlrl(target):
            return
        try:
            signature = inspect.signature(target)
        except (TypeError, ValueError):
            return
        if kind == "method":  # a function looked up on the class: self comes first
            signature = signature.replace(parameters=list(signature.parameters.values())[1:])
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            positional = []
        else:
            positional = [None] * len(node.args)
        try:
            signature.bind_partial(*positional, **{k.arg: None for k in node.keywords if k.arg})
        except TypeError as error:
            self.problems.append(f"{ast.unparse(node.func)}(...): {error}")


def check_calls(block: Block, namespace: dict) -> list[str]:
    tree = ast.parse(block.code, filename=f"{block.page}:{block.line}")
    scope = dict(namespace)
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            statement = ast.unparse(node)
            module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
            try:
                exec(statement, scope)
            except ImportError as error:
                if (module or "").split(".")[0] == "comlrl":
                    problems.append(f"{statement}: {error}")
    checker = CallChecker(scope)
    checker.visit(tree)
    return problems + checker.problems


# ------------------------------------------------------------------------------ code blocks run
def python_pages() -> list[Path]:
    return [page for page in PAGES if any(b.lang in ("python", "py") for b in blocks(page))]


@pytest.mark.parametrize("page", python_pages(), ids=page_id)
def test_python_blocks_run(page, docs_world):
    """Every python block of the page runs (not-run ones are checked), in page order."""
    namespace = {"__name__": "__docs__"}
    for block in blocks(page):
        if block.lang not in ("python", "py"):
            continue
        where = f"{page_id(page)}:{block.line}"
        problems = check_calls(block, namespace)
        assert not problems, f"{where}: " + "; ".join(problems)
        if block.not_run:
            continue
        code = compile(block.code, where, "exec")
        try:
            exec(code, namespace)
        except Exception as error:
            raise AssertionError(f"the block at {where} failed: {type(error).__name__}: {error}") from error


def test_not_run_blocks_say_why():
    for page in PAGES:
        for block in blocks(page):
            if block.not_run is not None:
                assert len(block.not_run) > 5, f"{page_id(page)}:{block.line}: say why the block is not run"


# ------------------------------------------------------------------------------ shell commands
def defined_flags(script: Path) -> set[str]:
    """The --flags a script (or a module of its folder that it imports) defines."""
    sources = [script.read_text()]
    for sibling in script.parent.glob("*.py"):
        if re.search(rf"^\s*(from|import)\s+{re.escape(sibling.stem)}\b", sources[0], re.M):
            sources.append(sibling.read_text())
    return set(re.findall(r"""["'](--[\w-]+)["']""", "\n".join(sources)))


def shell_commands(code: str) -> list[list[str]]:
    joined = re.sub(r"\\\n\s*", " ", code)
    commands = []
    for line in joined.splitlines():
        line = line.split(" #")[0].strip()
        if line and not line.startswith("#"):
            for part in re.split(r"&&|;", line):
                with contextlib.suppress(ValueError):
                    commands.append(shlex.split(part))
    return commands


def check_command(words: list[str], targets: set[str]) -> list[str]:
    if not words:
        return []
    program = Path(words[0]).name
    if program == "make":
        return [f"make {w}: no such target" for w in words[1:] if "=" not in w and w not in targets]
    if not (program.startswith("python") or program == "torchrun"):
        return []
    if "-m" in words:
        module = words[words.index("-m") + 1]
        if module.startswith("comlrl") and importlib.util.find_spec(module) is None:
            return [f"python -m {module}: no such module"]
        return []
    scripts = [i for i, w in enumerate(words) if w.endswith(".py")]
    if not scripts:
        return []
    path = ROOT / words[scripts[0]]
    if not path.is_file():
        return (
            [f"{words[scripts[0]]}: no such script"]
            if words[scripts[0]].startswith(("examples/", "benchmarks/"))
            else []
        )
    flags = defined_flags(path) | {"--help"}
    passed = [w.split("=")[0] for w in words[scripts[0] + 1 :] if w.startswith("--")]
    return [f"{words[scripts[0]]}: no flag {flag}" for flag in passed if flag not in flags]


def test_shell_commands_name_real_scripts_and_flags():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    problems = []
    for page in PAGES:
        for block in blocks(page):
            if block.lang in ("bash", "sh", "shell", "console"):
                for words in shell_commands(block.code):
                    problems += [f"{page_id(page)}:{block.line}: {p}" for p in check_command(words, targets)]
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------ names in prose
def test_fields_tables_name_real_fields():
    problems = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            marker = FIELDS.search(line)
            if not marker:
                continue
            classes = [getattr(comlrl, name.strip()) for name in marker.group(1).split(",")]
            fields = set.intersection(*({f.name for f in dataclasses.fields(c)} for c in classes))
            rows = 0
            for row in lines[i + 1 :]:
                if not row.startswith("|"):
                    if rows:
                        break
                    continue
                rows += 1
                first = row.split("|")[1]
                for name in re.findall(r"`([A-Za-z_]\w*)`", first):
                    if name not in fields:
                        problems.append(f"{page_id(page)}:{i + 1}: {name} is not a field of {marker.group(1)}")
            assert rows > 2, f"{page_id(page)}:{i + 1}: the fields marker is not followed by a table"
    assert not problems, "\n".join(problems)


def test_keyword_arguments_in_prose_exist():
    """A backticked ``name=value`` in a page names a real config field or argument."""
    known = known_names()
    problems = []
    for page in PAGES:
        for name in re.findall(r"`([A-Za-z_]\w*)=[^`=][^`]*`", prose(page)):
            if name not in known:
                problems.append(f"{page_id(page)}: {name}= is no config field or argument")
    assert not problems, "\n".join(sorted(set(problems)))


def test_readme_links_exist():
    """README.md is not part of the site (mkdocs checks the site's links): its relative links
    must name files of the repository."""
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", prose(ROOT / "README.md"))
    missing = [link for link in links if "://" not in link and not (ROOT / link).exists()]
    assert links and not missing, f"README.md links to missing files: {missing}"


# ------------------------------------------------------------------------------ the API reference
def test_api_reference_documents_every_public_name():
    documented = []
    for page in (ROOT / "docs" / "reference").glob("*.md"):
        for path in re.findall(r"^:::\s*([\w.]+)", page.read_text(), re.M):
            module_path, _, attribute = path.rpartition(".")
            try:
                documented.append(getattr(importlib.import_module(module_path), attribute))
            except (ImportError, AttributeError):
                documented.append(importlib.import_module(path))
    missing = [
        path
        for path, obj in public_objects().items()
        if not any(obj is d for d in documented) and not any(inspect.ismodule(d) and obj is d for d in documented)
    ]
    assert not missing, "no ::: entry in docs/reference for: " + ", ".join(missing)


# ------------------------------------------------------------------------------ the site builds
def test_site_builds_strict(tmp_path):
    """``mkdocs build --strict``: mkdocs, Material and mkdocstrings are in the development set."""
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    assert (tmp_path / "site" / "index.html").is_file()
