"""Contract types for import-linter (``.importlinter``) that its own types cannot express: they
read the modules' source, where import-linter reads only their import statements.

* ``strings_follow_layers``: a dotted path in a string (``import_string``, a task name, a model
  reference, a setting whose value names a function) is an import all the same; it must run
  the way the layers do.
* ``no_private_names``: a name that starts with one underscore is private to its module: no
  other module imports it (``from m import _x``) or reads it (``m._x``).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
from pathlib import Path

from importlinter import Contract, ContractCheck, fields, output

#: A whole dotted path (``app.module.name``), the shape of a string that names code.
DOTTED = re.compile(r"^([a-z_]+)(\.[A-Za-z_]\w*)+$")


@functools.cache
def module_tree(module: str) -> ast.Module | None:
    """The syntax tree of ``module``'s source; None for a module without a ``.py`` file."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    path = Path(spec.origin)
    return ast.parse(path.read_text(), filename=str(path))


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def dotted_strings(tree: ast.AST) -> set[str]:
    """Every string constant of the tree that is a whole dotted path."""
    return {
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and DOTTED.match(n.value)
    }


def settings_read(tree: ast.AST) -> set[str]:
    """Names of settings a module reads: ``settings.X`` and ``getattr(settings, "X"...)``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "settings":
            names.add(node.attr)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) >= 2
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id == "settings"
            and isinstance(node.args[1], ast.Constant)
        ):
            names.add(node.args[1].value)
    return names


def dotted_settings(tree: ast.Module) -> dict[str, str]:
    """Each top-level assignment of a settings module whose value is a dotted path string."""
    return {
        t.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        and DOTTED.match(node.value.value)
        for t in node.targets
        if isinstance(t, ast.Name)
    }


def higher_than(layers: list[str]) -> dict[str, set[str]]:
    """Each layer (top first) -> the layers above it."""
    return {layer: set(layers[:i]) for i, layer in enumerate(layers)}


def string_offenders(strings: dict[str, set[str]], layers: list[str]) -> dict[str, list[str]]:
    """For each module (``app.x``: its dotted strings) the strings that name a higher app."""
    above = higher_than(layers)
    offenders = {}
    for module, found in strings.items():
        forbidden = above.get(module.split(".")[0], set())
        if bad := sorted(s for s in found if s.split(".")[0] in forbidden):
            offenders[module] = bad
    return offenders


def setting_offenders(values: dict[str, str], readers: dict[str, set[str]], layers: list[str]) -> dict[str, list[str]]:
    """Settings whose value names a module of a higher app than a module that reads them."""
    above = higher_than(layers)
    offenders: dict[str, list[str]] = {}
    for module, names in readers.items():
        forbidden = above.get(module.split(".")[0], set())
        bad = sorted(f"{n} = {values[n]!r}" for n in names if n in values and values[n].split(".")[0] in forbidden)
        if bad:
            offenders[module] = bad
    return offenders


def app_modules(graph, package: str) -> list[str]:
    return sorted(m for m in graph.find_descendants(package) | {package} if ".migrations" not in m)


class StringsFollowLayersContract(Contract):
    """Options: ``layers`` (root packages, top first); ``settings`` (the settings module,
    default ``config.settings``)."""

    type_name = "strings_follow_layers"
    layers = fields.ListField(subfield=fields.StringField())
    settings = fields.StringField(required=False, default="config.settings")

    def check(self, graph, verbose: bool) -> ContractCheck:
        layers = list(self.layers)  # type: ignore[arg-type]
        trees = {m: module_tree(m) for layer in layers for m in app_modules(graph, layer)}
        trees = {m: t for m, t in trees.items() if t is not None}
        strings = string_offenders({m: dotted_strings(t) for m, t in trees.items()}, layers)
        values = dotted_settings(module_tree(str(self.settings)))
        read = setting_offenders(values, {m: settings_read(t) for m, t in trees.items()}, layers)
        return ContractCheck(kept=not strings and not read, metadata={"strings": strings, "settings": read})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for what, offenders in (
            ("names a higher app in a string", check.metadata["strings"]),
            ("reads a setting that names a higher app", check.metadata["settings"]),
        ):
            for module, bad in offenders.items():
                output.print_error(f"{module} {what}: {', '.join(bad)}")
                output.new_line()


def private_uses(module: str, tree: ast.Module, is_module, is_package: bool = False) -> list[str]:
    """``module``'s uses of another module's private names: ``from m import _x`` and
    ``m._x`` where ``m`` is a module imported by name. ``is_module(name)``: a project module;
    ``is_package``: ``module`` is a package's ``__init__`` (relative imports start there)."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - (node.level - 1)] + ([base] if base else []))
            if not is_module(base) or base == module:
                continue
            for alias in node.names:
                if is_private(alias.name) and not is_module(f"{base}.{alias.name}"):
                    found.append(f"line {node.lineno}: from {base} import {alias.name}")
                elif is_module(f"{base}.{alias.name}"):
                    aliases[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and is_module(alias.name):
                    aliases[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and aliases[node.value.id] != module
            and is_private(node.attr)
        ):
            found.append(f"line {node.lineno}: {aliases[node.value.id]}.{node.attr}")
    return sorted(set(found))


def is_package(module: str) -> bool:
    spec = importlib.util.find_spec(module)
    return bool(spec and spec.origin and spec.origin.endswith("__init__.py"))


class NoPrivateNamesContract(Contract):
    """Options: ``packages``, whose modules are checked (and whose private names are guarded)."""

    type_name = "no_private_names"
    packages = fields.ListField(subfield=fields.StringField())

    def check(self, graph, verbose: bool) -> ContractCheck:
        modules = {m for p in self.packages for m in app_modules(graph, p)}  # type: ignore[union-attr]
        offenders = {}
        for module in sorted(modules):
            tree = module_tree(module)
            if tree is not None and (bad := private_uses(module, tree, modules.__contains__, is_package(module))):
                offenders[module] = bad
        return ContractCheck(kept=not offenders, metadata={"offenders": offenders})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for module, bad in check.metadata["offenders"].items():
            output.print_error(f"{module} uses private names of other modules:")
            for line in bad:
                output.print_error(f"-   {line}", bold=False)
            output.new_line()
