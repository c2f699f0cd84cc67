"""MkDocs hook: list the generated benchmark pages on ``benchmarks.md``.

The pages under ``docs/benchmarks/`` are written by the benchmark runs and may not exist
yet; linking them statically would break ``mkdocs build --strict``. This hook replaces the
``<!-- benchmark-pages -->`` marker with links to the pages that exist.
"""

from __future__ import annotations

MARKER = "<!-- benchmark-pages -->"


def _title(file) -> str:
    for line in file.content_string.splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return file.src_uri.rsplit("/", 1)[-1].removesuffix(".md")


def on_page_markdown(markdown, page, config, files):
    if MARKER not in markdown:
        return markdown
    pages = sorted(
        (f for f in files.documentation_pages() if f.src_uri.startswith("benchmarks/")),
        key=lambda f: f.src_uri,
    )
    if not pages:
        listing = "*No benchmark results have been generated yet.*"
    else:
        listing = "\n".join(f"* [{_title(f)}]({f.src_uri})" for f in pages)
    return markdown.replace(MARKER, listing)
