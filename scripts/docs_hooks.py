"""MkDocs hooks (``hooks:`` in mkdocs.yml): add the pages ``scripts/docs_pages.py`` writes from
the code, and turn relative links that leave ``docs/`` (``../repairproxy/settings.py``, which work
when the page is read on the forge) into absolute repository URLs, which ``--strict`` accepts.
"""

from __future__ import annotations

import posixpath
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import docs_pages  # beside this file, not a package

ROOT = Path(__file__).resolve().parents[1]
_LINK = re.compile(r"(?<!!)\]\((?!https?:|mailto:|#)([^)\s]+)\)")


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for path, text in docs_pages.generated_pages().items():
        existing = files.get_file_from_path(path)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, path, content=text))
    return files


def outside_link(page_src: str, target: str, repo_url: str) -> str | None:
    """The repository URL for a link that leaves docs/, else None (a link MkDocs checks)."""
    path, _, anchor = target.partition("#")
    joined = posixpath.normpath(posixpath.join("docs", posixpath.dirname(page_src), path))
    if joined == "docs" or joined.startswith("docs/"):
        return None
    if joined.startswith(".."):
        raise ValueError(f"{page_src}: link {target!r} leaves the repository")
    kind = "tree" if (ROOT / joined).is_dir() else "blob"
    return f"{repo_url}/{kind}/main/{joined}" + (f"#{anchor}" if anchor else "")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    repo_url = str(config["repo_url"]).rstrip("/")

    def replace(match: re.Match[str]) -> str:
        url = outside_link(page.file.src_uri, match.group(1), repo_url)
        return match.group(0) if url is None else f"]({url})"

    return _LINK.sub(replace, markdown)
