"""Every reference the code makes to the project's own docs leads somewhere: the file exists
and the section it names is a heading there (``docs/drafter.md §5`` -> ``## 5. ...``)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REF = re.compile(r"(?<![\w./])docs/([a-z_-]+\.md)((?: §\d+(?:-§\d+)?)?)")


def test_every_docs_reference_exists():
    seen = 0
    for py in [*ROOT.glob("core/**/*.py"), *ROOT.glob("console/**/*.py"), *ROOT.glob("tests/**/*.py")]:
        for name, sec in REF.findall(py.read_text(encoding="utf-8")):
            doc = ROOT / "docs" / name
            assert doc.is_file(), f"{py.relative_to(ROOT)} cites docs/{name}, which does not exist"
            for n in re.findall(r"\d+", sec):
                assert re.search(rf"^## {n}\. ", doc.read_text(encoding="utf-8"), re.M), \
                    f"{py.relative_to(ROOT)} cites docs/{name} §{n}, which has no section {n}"
            seen += 1
    assert seen >= 30  # the ML code's references (drafter, training, evaluation rules)


def test_no_reference_to_a_document_outside_the_repository():
    for py in [*ROOT.glob("core/**/*.py"), *ROOT.glob("tests/**/*.py")]:
        assert not re.search(r"\bspec §\d", py.read_text(encoding="utf-8")), py
