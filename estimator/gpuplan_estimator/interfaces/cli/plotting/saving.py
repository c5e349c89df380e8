"""Writing a picture to the file `--plot FILE` names; the format follows the extension."""

from __future__ import annotations

import html
import io
from pathlib import Path

from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.interfaces.cli.plotting import figures

PNG_DPI = 150
FORMATS = (".png", ".svg", ".html")


def check_target(path: str | Path) -> None:
    """Raise InvalidRequestError("--plot", ...) unless `path` ends in one of `FORMATS`."""
    if Path(path).suffix.lower() not in FORMATS:
        raise InvalidRequestError(
            "--plot", f"{str(path)!r}: the file name must end in {', '.join(FORMATS)}")


def save(picture: figures.Picture, path: str | Path) -> Path:
    """Write `picture` as PNG, SVG or a self-contained HTML page, by `path`'s extension.

    Another extension raises InvalidRequestError("--plot", ...) before anything is drawn; a
    path that cannot be written raises the OSError (the CLI reports it).
    """
    target = Path(path)
    suffix = target.suffix.lower()
    check_target(target)
    if suffix == ".png":
        picture.figure.savefig(target, format="png", dpi=PNG_DPI)
    elif suffix == ".svg":
        target.write_text(svg_text(picture), encoding="utf-8")
    else:
        target.write_text(html_page(picture), encoding="utf-8")
    return target


def svg_text(picture: figures.Picture) -> str:
    """The figure as an SVG document; fonts are drawn as paths, so it needs no font files.

    The date is left out so the same figure gives the same file."""
    buffer = io.StringIO()
    picture.figure.savefig(buffer, format="svg", metadata={"Date": None})
    return buffer.getvalue()


def _inline_svg(svg: str) -> str:
    """The `<svg>` element alone: an XML declaration or DOCTYPE is not allowed inside HTML."""
    return svg[svg.index("<svg"):]


def _table_html(table: figures.Table) -> str:
    head = "".join(f"<th scope=\"col\">{html.escape(c)}</th>" for c in table.columns)
    body = "\n".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>"
                     for row in table.rows)
    return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table>"


_STYLE = ("body{font-family:sans-serif;margin:1.5em}svg{max-width:100%;height:auto}"
          "table{border-collapse:collapse;font-size:0.85em}"
          "th,td{border:1px solid #ccc;padding:0.2em 0.6em;text-align:right}"
          "th:first-child,td:first-child{text-align:left}")


def html_page(picture: figures.Picture) -> str:
    """A page that needs nothing else: title, the figure as inline SVG, then its numbers as a
    table (for screen readers and copying). No scripts, no fetches."""
    title = html.escape(picture.title)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>{title}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n"
        f"<h1>{title}</h1>\n<figure role=\"img\" aria-label=\"{title}\">\n"
        f"{_inline_svg(svg_text(picture))}\n</figure>\n"
        f"<h2>The numbers</h2>\n{_table_html(picture.table)}\n</body>\n</html>\n"
    )
