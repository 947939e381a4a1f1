"""The docs as a user meets them: every ```python block of README.md and of each docs/*.md page runs
as written (in order, one namespace a page, in a fresh folder) unless an HTML comment right
before it says why not (``<!-- not run: needs S3 credentials -->``); links between pages resolve;
benchmark figures come from the lab notebook; GPU claims say where they were measured."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re

import pytest

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
ROOT = DOCS.parent
#: what a page's examples import beyond the test extra (the page is skipped, saying so, without)
REQUIRES = {"lightning.md": "lightning", "huggingface.md": "accelerate"}
BLOCK = re.compile(r"^(?:<!-- not run: (?P<why>[^>]*?) -->\n)?```python\n(?P<code>.*?)^```",
                   re.DOTALL | re.MULTILINE)
NOT_RUN = re.compile(r"<!-- not run:")


def _pages() -> list[pathlib.Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def _blocks(page: pathlib.Path) -> list[tuple[str, str | None]]:
    """``(code, reason it is not run or None)`` of each ```python block of ``page``."""
    return [(m["code"], m["why"]) for m in BLOCK.finditer(page.read_text())]


@pytest.mark.parametrize("name", [p.name for p in _pages() if _blocks(p)])
def test_code_blocks_run_as_written(name: str, tmp_path: pathlib.Path, monkeypatch) -> None:
    page = ROOT / name if name == "README.md" else DOCS / name
    if name in REQUIRES:
        pytest.importorskip(REQUIRES[name], reason=f"{name}'s examples need {REQUIRES[name]}")
    import torch

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the examples' small models: 20x faster than 2 threads on busy cores
    scope: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    ran = 0
    try:
        for i, (code, why) in enumerate(_blocks(page)):
            if why is not None:
                assert why.strip(), f"{name} block {i}: say why it is not run"
                continue
            exec(compile(code, f"{page}[block {i}]", "exec"), scope)  # noqa: S102
            ran += 1
    finally:
        torch.set_num_threads(threads)
    assert ran or not os.listdir(tmp_path)


def test_every_not_run_marker_stands_before_a_python_block() -> None:
    for page in _pages():
        text = page.read_text()
        markers = len(NOT_RUN.findall(text))
        assert markers == sum(why is not None for _, why in _blocks(page)), page.name


ON_GPU = "measured on an H100"


def test_gpu_claims_say_where_they_were_measured() -> None:
    # issues 26 (item 22) and 30: README's GPU bullet and the GPU part of docs/async.md say
    # where the GPU path was measured, and link the figures
    readme = (DOCS.parent / "README.md").read_text()
    bullet = readme[readme.index("- **GPU training**"):]
    bullet = " ".join(bullet[:bullet.index("\n- **")].split())
    assert ON_GPU in bullet and "benchmarks.md#the-gpu-writer-on-an-h100" in bullet
    async_page = (DOCS / "async.md").read_text()
    gpu_part = async_page.index("**Snapshot into spare GPU memory**")
    before = " ".join(async_page[gpu_part - 2500:gpu_part].split())
    assert "The GPU path, measured on an H100" in before
    assert "lab/notebook.md#the-gpu-writer-on-an-h100" in before


NOTEBOOK = DOCS / "lab" / "notebook.md"


def _without_code(text: str) -> str:
    return re.sub(r"```.*?```", "", text, flags=re.DOTALL)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: pathlib.Path) -> set[str]:
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#+ (.*)$", _without_code(page.read_text()), re.MULTILINE):
        slug = _slug(heading)
        seen[slug] = seen.get(slug, -1) + 1
    return {s if n == 0 else f"{s}-{n}" for s, count in seen.items() for n in range(count + 1)}


def _section(heading: str) -> str:
    """The notebook's text under ``heading``, up to the next heading."""
    text = NOTEBOOK.read_text()
    start = re.search(rf"^#+ {re.escape(heading)}\n", text, re.MULTILINE)
    assert start, f"no section {heading!r} in docs/lab/notebook.md"
    end = re.search(r"^#+ ", text[start.end():], re.MULTILINE)
    return text[start.end():start.end() + end.start() if end else len(text)]


def test_links_between_pages_resolve() -> None:
    # issue 26 item 20: the old benchmarks page's sections moved to docs/lab/notebook.md
    pages = [DOCS.parent / "README.md", *sorted(DOCS.rglob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", _without_code(page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists() or (anchor and dest.suffix == ".md"
                                     and anchor not in _anchors(dest)):
                broken.append(f"{page.relative_to(DOCS.parent)}: {target}")
    assert not broken


def test_benchmark_figures_come_from_the_notebook() -> None:
    # every figure of the user's page is one the notebook measured (never rounded or made up)
    page = _without_code((DOCS / "benchmarks.md").read_text())
    notebook = NOTEBOOK.read_text()
    commands = " ".join(notebook.replace("\\\n", " ").split())  # as one line each
    figures = re.findall(r"[−+-]?\d[\d,]*\.\d+ ?[×%]?|[−+-]?\d[\d,]* ?[×%]", page)
    assert len(figures) > 50
    assert [f for f in figures if f not in notebook] == []
    data = json.loads((DOCS / "lab" / "figures.json").read_text())
    for figure in data["figures"]:
        section = _section(figure["section"])
        assert " ".join(figure["command"].split()) in commands, figure["id"]
        for values in figure["series"].values():
            assert len(values) == len(figure["categories"])
            assert [v for v in values if v not in section] == [], figure["id"]
        assert f"plots/{figure['id']}.svg" in page, figure["id"]
    shown = re.findall(r"```\n(.*?)```", (DOCS / "benchmarks.md").read_text(), re.DOTALL)
    assert [c for c in shown if " ".join(c.split()) not in commands] == []


def test_plots_are_drawn_from_the_figures(tmp_path: pathlib.Path) -> None:
    spec = importlib.util.spec_from_file_location("plots", DOCS.parent / "benchmarks" / "plots.py")
    plots = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plots)
    from xml.etree import ElementTree

    for path in plots.draw(out=tmp_path):
        assert path.read_bytes() == (DOCS / "plots" / path.name).read_bytes(), path.name
        assert ElementTree.parse(path).getroot().tag == "{http://www.w3.org/2000/svg}svg"
