"""The documentation site: its code runs, its commands exist, it builds without warnings.

Convention: every fenced block opened with exactly ```` ```python ```` in the pages of
:data:`EXECUTED` is executed, the blocks of one page in order in one namespace (a page reads as
one program), in a temporary working directory, with float64 on (``conftest``) and
matplotlib's non-interactive back end. Blocks meant to be shown but not run use another tag
(```` ```pycon ````, ```` ```text ````). Shell blocks (```` ```bash ````) of the command-line
page are checked for ``dpgm`` sub-commands that exist. ``mkdocs build --strict`` (warnings are
errors) builds the whole site into a temporary folder.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import matplotlib
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

#: Pages whose ```python blocks are executed.
EXECUTED = [
    "index.md",
    "getting-started.md",
    "howto/cgm.md",
    "howto/private-pgm.md",
    "howto/private-mrf.md",
    "privacy.md",
    "em_variants.md",
    "mechanisms.md",
    "synthetic_data.md",
]

FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```\s*$", re.S | re.M)


def fenced_blocks(text: str, lang: str) -> list[tuple[int, str]]:
    """``(first line number, code)`` of every fenced block tagged exactly ``lang``."""
    out = []
    for m in FENCE.finditer(text):
        if m.group(1) == lang:
            line = text.count("\n", 0, m.start(2)) + 1
            out.append((line, m.group(2)))
    return out


def test_fence_parser() -> None:
    text = "x\n```python\na = 1\n```\n\n```pycon\n>>> b\n```\n```python\nc = 2\nd = 3\n```\n"
    assert fenced_blocks(text, "python") == [(3, "a = 1\n"), (10, "c = 2\nd = 3\n")]
    assert fenced_blocks(text, "pycon") == [(7, ">>> b\n")]


@pytest.mark.parametrize("page", EXECUTED)
def test_page_snippets_run(page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = DOCS / page
    blocks = fenced_blocks(path.read_text(), "python")
    if page != "index.md":
        assert blocks, f"{page} has no ```python block to run"
    matplotlib.use("Agg")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": f"docs_{Path(page).stem}"}
    for line, code in blocks:
        # pad so that tracebacks name the markdown file's own line numbers
        source = "\n" * (line - 1) + code
        exec(compile(source, str(path), "exec"), namespace)
    import matplotlib.pyplot as plt

    plt.close("all")


def test_cli_page_names_existing_commands_and_options() -> None:
    from typer.testing import CliRunner

    from numpyro_dpgm.cli import app

    text = (DOCS / "cli.md").read_text()
    used: dict[str, set[str]] = {}
    for _, code in fenced_blocks(text, "bash"):
        for line in code.replace("\\\n", " ").splitlines():
            words = line.split("#")[0].split()
            if len(words) >= 2 and words[0] == "dpgm" and not words[1].startswith("-"):
                used.setdefault(words[1], set()).update(
                    w.split("=")[0] for w in words[2:] if w.startswith("--"))
    assert used, "the command-line page shows no dpgm command"
    runner = CliRunner()
    for cmd, options in sorted(used.items()):
        result = runner.invoke(app, [cmd, "--help"], terminal_width=200)
        assert result.exit_code == 0, f"`dpgm {cmd} --help` failed: {result.output}"
        unknown = [o for o in sorted(options) if o not in result.output]
        assert not unknown, f"`dpgm {cmd}` has no option(s) {unknown}"


def _public_modules() -> list[str]:
    """Modules of the package (tracked by git when in a checkout) that declare ``__all__``."""
    files = sorted((ROOT / "numpyro_dpgm").rglob("*.py"))
    git = shutil.which("git")
    if git and (ROOT / ".git").exists():
        out = subprocess.run([git, "ls-files", "numpyro_dpgm"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
        files = [ROOT / f for f in out if f.endswith(".py")]
    names = []
    for f in files:
        rel = f.relative_to(ROOT).with_suffix("")
        parts = rel.parts
        if parts[-1] == "__init__" or any(p.startswith("_") for p in parts):
            continue
        if parts[1] in ("demo", "cli"):
            continue  # the demo and the command line have pages of their own
        tree = ast.parse(f.read_text())
        if any(isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "__all__"
                                                  for t in n.targets) for n in tree.body):
            names.append(".".join(parts))
    return names


def test_api_reference_covers_every_public_module() -> None:
    text = "\n".join(p.read_text() for p in (DOCS / "api").glob("*.md"))
    documented = set(re.findall(r"^::: (\S+)", text, re.M))
    missing = [m for m in _public_modules() if m not in documented]
    assert not missing, f"modules without an API reference section: {missing}"


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install -e '.[docs]')")
    pytest.importorskip("mkdocstrings", reason="mkdocstrings is not installed (the docs extra)")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean",
         "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=300,
    )
    elapsed = time.perf_counter() - start
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"mkdocs build --strict failed after {elapsed:.0f} s:\n{log}"
    assert "WARNING" not in log, log
    site = tmp_path / "site"
    for page in ["index.html", "getting-started/index.html", "api/estimation/index.html"]:
        assert (site / page).is_file(), f"the site lacks {page}"
    # the API reference is generated from the docstrings, not left empty
    api = (site / "api/estimation/index.html").read_text()
    assert 'id="numpyro_dpgm.estimation.cgm_em.cgm_em"' in api


def test_every_committed_page_is_in_the_nav() -> None:
    """Pages tracked by git (pages being written may sit in docs/ untracked) are in the nav."""
    git = shutil.which("git")
    if not (git and (ROOT / ".git").exists()):
        pytest.skip("not a git checkout: cannot tell committed pages from drafts")
    tracked = subprocess.run([git, "ls-files", "docs"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    pages = {str(Path(f).relative_to("docs")) for f in tracked if f.endswith(".md")}
    nav = set(re.findall(r":\s*(\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M))
    missing = sorted(pages - nav)
    assert not missing, f"committed pages missing from the nav of mkdocs.yml: {missing}"
