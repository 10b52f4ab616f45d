"""The docs say what the code does: README short with the two set-up commands CI runs,
every estimator knob documented, every linked doc present."""

import dataclasses
import re
from pathlib import Path

import pytest

from turngym import credit

pytestmark = pytest.mark.fast
ROOT = Path(__file__).resolve().parents[1]


def test_readme_is_short_with_the_two_setup_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    setup = re.search(r"## Set-up.*?```bash\n(.*?)```", text, re.DOTALL).group(1).strip()
    install, tests = setup.splitlines()
    assert install.startswith("pip install") and "turngym train --config quickstart" in install
    assert tests == "python -m pytest -q"
    assert tests in (ROOT / ".ci" / "run").read_text()  # CI runs the README's command


def test_every_linked_doc_exists():
    for md in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for link in re.findall(r"\]\(([^)#:]+\.(?:md|png))(?:#[^)]*)?\)", md.read_text()):
            assert (md.parent / link).exists(), f"{md.name} links {link}"


def test_every_estimator_and_knob_is_documented():
    doc = (ROOT / "docs" / "credit.md").read_text()
    sections = dict(re.findall(r"## `(\w+)`(.*?)(?=\n## |\Z)", doc, re.DOTALL))
    builtin = {"grpo", "info_gain", "td_log_ratio", "step_groups", "branch_contrast",
               "role_judge"}
    for name in builtin:
        assert name in sections, name
        for f in dataclasses.fields(credit.params_class(name)):
            assert f"`{f.name}`" in sections[name], (name, f.name)
