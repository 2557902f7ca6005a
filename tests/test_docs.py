"""The documentation says what the code does: configuration, commands, README.

The site itself is built strictly by CI (``mkdocs build --strict``: broken
links, anchors and API names fail it); these tests check what a build cannot:
that the configuration table covers every variable the code reads and names
no variable the code lacks, and that every command getting-started shows is
one CI runs. They read files only: no MPI, no MkDocs.
"""

from __future__ import annotations

import re
from pathlib import Path

from scripts import REPO, load_script

DOCS = REPO / "docs"
VARIABLE = re.compile(r"HPCCOMM_[A-Z0-9_]*[A-Z0-9]")
#: Where hpccomm reads environment variables: the package, the launcher, torch's start-up hook, the Slurm templates.
CODE = [*(REPO / "hpccomm").rglob("*.py"), *(REPO / "hpccomm_run").rglob("*.py"), REPO / "hpccomm_autoload.py",
        *(REPO / "slurm").glob("*.sbatch")]
CI_MARKERS = ("<!-- ci: run -->", "<!-- ci: test command -->")


def _config_table_hook():
    return load_script(DOCS / "hooks" / "config_table.py")


def _names_in(paths: list[Path]) -> set[str]:
    return {name for path in paths for name in VARIABLE.findall(path.read_text())}


def _pages() -> list[Path]:
    return [REPO / "README.md", *DOCS.rglob("*.md")]


def _fenced_blocks(text: str) -> list[tuple[str, str, str]]:
    """(line before the fence, language, body) of every fenced block."""
    return re.findall(r"(?m)^([^\n]*)\n```(\w*)\n(.*?)\n```", text, re.DOTALL)


def test_config_table_has_a_row_per_setting_of_config_py():
    hook = _config_table_hook()
    rows = hook.rows()
    config = hook.load_config_module()
    assert len(rows) == len(config.Config.__dataclass_fields__)
    shown = {variable for variable, _default, _effect in rows}
    assert shown == _names_in([REPO / "hpccomm" / "config.py"])
    # Defaults come from config.py's own reader: spot-check two against what it reads when unset.
    defaults = {variable: default for variable, default, _effect in rows}
    assert defaults["HPCCOMM_ALGO"] == f"`{config.settings.algo}`"
    assert str(config.settings.shm_slot_bytes) in defaults["HPCCOMM_SHM_SLOT_BYTES"]
    table = hook.on_page_markdown((DOCS / "configuration.md").read_text(), page=None)
    assert hook.MARKER not in table and "| `HPCCOMM_ALGO` |" in table


def test_every_variable_the_code_reads_is_on_the_configuration_page():
    hook = _config_table_hook()
    page = hook.on_page_markdown((DOCS / "configuration.md").read_text(), page=None)
    missing = _names_in(CODE) - set(VARIABLE.findall(page))
    assert not missing, f"docs/configuration.md does not describe {sorted(missing)}"


def test_the_docs_name_no_variable_the_code_lacks():
    known = _names_in(CODE)
    for page in _pages():
        unknown = set(VARIABLE.findall(page.read_text())) - known
        # The test suite's and CI's own (HPCCOMM_TEST_LAUNCHER, HPCCOMM_UCC_SOURCE), for the pages on testing.
        unknown -= _names_in([REPO / "tests" / "launch.py", REPO / ".ci" / "run", REPO / "tests" / "gpu" / "acceptance.sh"])
        assert not unknown, f"{page.relative_to(REPO)} names {sorted(unknown)}, which no code reads"


def test_every_getting_started_command_is_run_by_ci():
    blocks = _fenced_blocks((DOCS / "getting-started.md").read_text())
    shell = [(before, body) for before, language, body in blocks if language in ("bash", "sh", "shell", "console")]
    assert shell, "docs/getting-started.md shows no commands"
    for before, body in shell:
        assert before.strip() in CI_MARKERS, f"command not run by CI (no ci marker before it): {body!r}"
    # CI runs the `ci: run` blocks of this page (.ci/run) and the README's test command, which this page repeats.
    assert "docs/getting-started.md" in (REPO / ".ci" / "run").read_text()
    readme_tests = [body for before, _lang, body in _fenced_blocks((REPO / "README.md").read_text())
                    if before.strip() == "<!-- ci: test command -->"]
    page_tests = [body for before, body in shell if before.strip() == "<!-- ci: test command -->"]
    assert len(readme_tests) == 1 and page_tests == readme_tests


def test_readme_is_short_and_its_links_resolve():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", readme):
        assert (REPO / target).exists(), f"README.md links to {target}, which does not exist"
