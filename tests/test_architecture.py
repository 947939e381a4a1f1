"""The shape of the house (docs/architecture.md), checked so that the next change cannot quietly
break it: the layer contracts of pyproject.toml (import-linter), few modules at the top, every
package saying its job and what it may import, and no reach into another module's private names.
"""

from __future__ import annotations

import ast
import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ckptstore"
MAX_FLAT = 15

# Private attributes of objects that are not ours, each with the reason it is read.
FOREIGN_PRIVATE = {
    "_metadata": "torch: the state_dict's version metadata (nn.Module.state_dict sets it)",
    "_indices": "torch: a sparse gradient's indices without the coalesce .indices() forces",
    "_SubParsersAction": "argparse: the type of add_subparsers' result, for a type hint",
    "_exit": "os: an upload process's watcher thread ends it (sys.exit there ends a thread)",
}


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_layer_contracts_are_kept(capsys: pytest.CaptureFixture[str]) -> None:
    """import-linter's contracts (pyproject.toml, [tool.importlinter]): nothing imports upward."""
    lint = pytest.importorskip("importlinter.cli", reason="import-linter comes with .[test]")
    code = lint.lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True,
                             no_logo=True)
    out = capsys.readouterr().out
    assert code == 0, out


def test_the_layer_contract_ignores_no_import() -> None:
    """Issue 27 removed the last known break: a new one is argued in review, not listed."""
    tomllib = pytest.importorskip("tomllib", reason="the standard library has tomllib from 3.11")
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"]
    assert [c.get("ignore_imports", []) for c in contracts] == [[] for _ in contracts]


def test_few_modules_lie_flat() -> None:
    flat = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(flat) <= MAX_FLAT, f"{len(flat)} modules flat in ckptstore/: {flat}"


def test_every_package_says_its_job_and_what_it_may_import() -> None:
    missing = []
    for init in sorted(PACKAGE.rglob("__init__.py")):
        if init.parent == PACKAGE:
            continue
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        if len(doc.splitlines()[0] if doc else "") < 20 or not re.search(r"^May import:", doc, re.M):
            missing.append(str(init.relative_to(ROOT)))
    assert not missing, f"packages without a job line or a 'May import:' line: {missing}"


def _private_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    me = _module(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if not source.split(".")[0] in ("ckptstore", "ckptcodecs"):
                continue
            if source.split(".")[0] == "ckptcodecs" and any(
                    p.startswith("_") for p in source.split(".")[1:]):
                out.append(f"{path.relative_to(ROOT)}:{node.lineno} from {source}")
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    out.append(f"{path.relative_to(ROOT)}:{node.lineno} {alias.name} "
                               f"from {source}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("ckptcodecs._"):
                    out.append(f"{path.relative_to(ROOT)}:{node.lineno} import {alias.name}")
    return out


def test_no_private_name_is_imported_from_another_module() -> None:
    hits = [h for p in _sources() for h in _private_imports(p)]
    assert not hits, "private names imported across modules:\n" + "\n".join(hits)


def test_no_private_attribute_of_another_object_is_touched() -> None:
    hits = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if node.attr in FOREIGN_PRIVATE:
                continue
            hits.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    assert not hits, "private attributes of other objects:\n" + "\n".join(hits)


def test_no_any_stands_for_a_store() -> None:
    """Signatures name the project's types; ``store: Any`` hid an import cycle."""
    hits = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.arg) and node.annotation is not None and \
                    node.arg in ("store", "committer", "repo", "writer", "pipeline") and \
                    ast.unparse(node.annotation) in ("Any", "object"):
                hits.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.arg}: Any")
    assert not hits, "\n".join(hits)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([os.path.abspath(__file__), "-q"]))
