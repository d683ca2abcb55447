"""The README and the docs site: the configuration reference is what its generator writes, the
README stays a five-minute read, every relative link leads to a file, every page is in the nav.
`mkdocs build --strict` (`make docs`) checks the site's links and anchors as well."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest
import yaml

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README_MAX_BYTES = 15_000
# [text](target) and ![alt](target), the target up to a space (a title) or the closing paren
LINK = re.compile(r"!?\[[^\]]*\]\(<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_config_reference", DOCS / "gen_config_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def test_the_configuration_reference_is_generated_from_the_config_classes() -> None:
    page = (DOCS / "configuration.md").read_text(encoding="utf-8")
    assert page == _generator().reference(), "run python docs/gen_config_reference.py"


def test_the_readme_is_short() -> None:
    size = len((ROOT / "README.md").read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes: move detail into docs/"


@pytest.mark.parametrize("path", [ROOT / "README.md", *_pages()], ids=lambda p: p.name)
def test_every_relative_link_leads_to_a_file(path: Path) -> None:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))  # code is not linked
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL (https:, mailto:) or an anchor on the same page
        file = target.split("#", 1)[0]
        if not (path.parent / file).is_file():
            broken.append(target)
    assert broken == [], f"{path.relative_to(ROOT)} links to missing files"


def _nav_pages(nav: list) -> set[str]:
    pages: set[str] = set()
    for entry in nav:
        values = entry.values() if isinstance(entry, dict) else [entry]
        for value in values:
            pages |= _nav_pages(value) if isinstance(value, list) else {value}
    return pages


def test_every_page_is_in_the_nav() -> None:
    mkdocs = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    nav = _nav_pages(mkdocs["nav"])
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert pages - nav == set(), "add these pages to mkdocs.yml's nav"
    assert nav - pages == set(), "mkdocs.yml's nav names pages that do not exist"
