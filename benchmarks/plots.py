"""Draw the plots of docs/benchmarks.md from the measured figures in docs/lab/figures.json.

Each figure of the data file is a grouped horizontal bar chart written as a small SVG file (no
plotting library needed, the same bytes on every run): one group of bars per category, one bar
per series, each labelled with the value as the lab notebook wrote it. Usage::

    .venv/bin/python benchmarks/plots.py                  # docs/plots/<figure id>.svg
    .venv/bin/python benchmarks/plots.py --out /tmp/plots
"""

from __future__ import annotations

import argparse
import json
import pathlib
from html import escape

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "lab" / "figures.json"
OUT = ROOT / "docs" / "plots"

#: colours of the series, in order (colour-blind safe: Okabe and Ito)
COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00")
LABEL_W, BAR_W, VALUE_W, BAR_H, GAP, TOP = 250, 380, 90, 14, 10, 48


def number(text: str) -> float:
    """The value of a figure as written in the notebook (``"1.2210×"``, ``"+3 %"``, ``"1,496"``)."""
    return float(text.replace("×", "").replace("%", "").replace(",", "").replace("+", ""))


def svg(figure: dict) -> str:
    """One figure as an SVG document: a bar per (category, series), its value written after it."""
    series = list(figure["series"].items())
    top = max(number(v) for _, values in series for v in values) or 1.0
    group = len(series) * BAR_H + GAP
    legend_y = TOP + len(figure["categories"]) * group + 8
    height = legend_y + 18 * len(series) + 8
    width = LABEL_W + BAR_W + VALUE_W
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="8" y="20" font-size="14" font-weight="bold">{escape(figure["title"])}</text>',
           f'<text x="8" y="38" fill="#555">{escape(figure["section"])} '
           f'(docs/lab/notebook.md)</text>']
    for i, category in enumerate(figure["categories"]):
        y0 = TOP + i * group
        out.append(f'<text x="{LABEL_W - 8}" y="{y0 + len(series) * BAR_H / 2 + 4:.1f}" '
                   f'text-anchor="end">{escape(category)}</text>')
        for k, (_, values) in enumerate(series):
            w = BAR_W * number(values[i]) / top
            y = y0 + k * BAR_H
            out.append(f'<rect x="{LABEL_W}" y="{y}" width="{w:.1f}" height="{BAR_H - 2}" '
                       f'fill="{COLOURS[k % len(COLOURS)]}"/>')
            out.append(f'<text x="{LABEL_W + w + 4:.1f}" y="{y + BAR_H - 4}">'
                       f'{escape(values[i])}</text>')
    for k, (name, _) in enumerate(series):
        y = legend_y + 18 * k
        out.append(f'<rect x="{LABEL_W}" y="{y}" width="12" height="12" '
                   f'fill="{COLOURS[k % len(COLOURS)]}"/>')
        out.append(f'<text x="{LABEL_W + 18}" y="{y + 10}">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def draw(figures: pathlib.Path = FIGURES, out: pathlib.Path = OUT) -> list[pathlib.Path]:
    """Write ``<id>.svg`` under ``out`` for every figure of ``figures``; returns the paths."""
    data = json.loads(figures.read_text())
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for figure in data["figures"]:
        if any(len(v) != len(figure["categories"]) for v in figure["series"].values()):
            raise ValueError(f"figure {figure['id']}: a series has not one value per category")
        path = out / f"{figure['id']}.svg"
        path.write_text(svg(figure), encoding="utf-8")
        written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--figures", type=pathlib.Path, default=FIGURES)
    parser.add_argument("--out", type=pathlib.Path, default=OUT)
    args = parser.parse_args()
    for path in draw(args.figures, args.out):
        print(path)


if __name__ == "__main__":
    main()
