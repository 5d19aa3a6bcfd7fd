"""The manual speaks of the product: no words about how the work went, and pages short enough to read.

README.md, docs/**/*.md and the package's Python files may not narrate the work (sessions, numbered rounds, issues,
goals met or missed, throwaway scripts); history lives in CHANGELOG.md and dated files under benchmarks/results/.
The patterns are word-bounded and leave the product's own words alone: rounding, round-trip, ``round(x)``, the
benchmark's "each round" of alternating methods, "issue a warning".
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 250
PAGE_MAX_LINES = 400

_ORDINAL = (
    r"first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|fourteenth|"
    r"fifteenth|\d+(?:st|nd|rd|th)|previous|earlier|later|last|next|this|that"
)
# The words "issue" may be followed by when it is a verb ("issue a warning", "issues an error").
_ISSUE_AS_VERB = r"a|an|one|its|their|the|warnings?|errors?|calls?|requests?|commands?"

PROCESS_WORDS: dict[str, re.Pattern[str]] = {
    "session": re.compile(r"\bsessions?\b", re.IGNORECASE),
    "numbered round": re.compile(rf"\b(?:{_ORDINAL})[\s-]+(?:round|wave)s?\b", re.IGNORECASE),
    "round N": re.compile(r"(?<!-)\b(?:round|wave)s?\s+#?\d+\b", re.IGNORECASE),  # not a flag: --rounds 2
    "issue": re.compile(rf"\bissue(?:s|'s)?\b(?!\s+(?:{_ISSUE_AS_VERB})\b)", re.IGNORECASE),
    "issue number": re.compile(r"(?<![\w&/])#\d+\b"),
    "goal": re.compile(r"\bgoals?\b", re.IGNORECASE),
    "throwaway": re.compile(r"\bthrow-?away\b", re.IGNORECASE),
}


def manual_files() -> list[Path]:
    """README.md, every Markdown page under docs/, every Python file of the package."""
    return [
        ROOT / "README.md",
        *sorted((ROOT / "docs").rglob("*.md")),
        *sorted((ROOT / "tensorslim").rglob("*.py")),
    ]


def process_words(text: str) -> list[str]:
    """``"line N: <kind>: <match>"`` for every process word in ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for kind, pattern in PROCESS_WORDS.items():
            found += [f"line {number}: {kind}: {m.group(0)!r}" for m in pattern.finditer(line)]
    return found


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("measured in the sixth session", ["session"]),
        ("docs/speed.md, Tenth round", ["numbered round"]),
        ("## Eleventh round: every figure", ["numbered round"]),
        ("as in round 3 and wave 2", ["round N", "round N"]),
        ("as issue 17, item 3 asks; the issue's length", ["issue", "issue"]),
        ("fixed in #17", ["issue number"]),
        ("Goal met: 1.5x", ["goal"]),
        ("a throwaway script", ["throwaway"]),
        ("rounding to nearest, a round-trip, round(x), round=5, rounds once", []),
        ("methods alternate within each round; in alternating order over rounds", []),
        ("step_ab.py --rounds 2 --out ab", []),
        ("the loader issues a warning and issue an error; colour #1f77b4; a ## heading", []),
    ],
)
def test_patterns_find_process_words_and_spare_product_words(text: str, expected: list[str]) -> None:
    assert [hit.split(": ")[1] for hit in process_words(text)] == expected


@pytest.mark.parametrize("path", manual_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_process_words(path: Path) -> None:
    hits = process_words(path.read_text(encoding="utf-8"))
    assert not hits, f"{path.relative_to(ROOT)} narrates the work instead of the product:\n" + "\n".join(hits)


def test_readme_fits_a_few_screens() -> None:
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"


@pytest.mark.parametrize("path", sorted((ROOT / "docs").rglob("*.md")), ids=lambda p: str(p.relative_to(ROOT)))
def test_doc_page_is_short(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= PAGE_MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines (at most {PAGE_MAX_LINES})"


def test_api_reference_documents_every_public_name() -> None:
    import tensorslim

    spec = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "mkdocs_hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    assert hooks.MARKER in (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
    assert hooks.public_api() == tensorslim._EXPORTS
    entries = re.findall(r"^::: (\S+)$", hooks.reference_markdown(hooks.public_api()), re.MULTILINE)
    assert sorted(entries) == sorted(f"{module}.{name}" for name, module in tensorslim._EXPORTS.items())


def test_readme_links_resolve() -> None:
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text(encoding="utf-8"))
    local = [t for t in targets if "://" not in t]
    assert local, "README.md links no page"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README.md links missing files: {missing}"


def test_version_has_one_source() -> None:
    import tensorslim

    source = (ROOT / "tensorslim" / "_version.py").read_text(encoding="utf-8")
    assert "import" not in source  # pyproject reads it without importing the package
    assert re.findall(r'^__version__ = "([^"]+)"$', source, re.MULTILINE) == [tensorslim.__version__]
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    project = pyproject.split("\n[project]\n")[1].split("\n[")[0]
    assert not re.search(r"^version\s*=", project, re.MULTILINE), "[project] states a version of its own"
    assert 'dynamic = ["version"]' in project
    assert 'version = { attr = "tensorslim._version.__version__" }' in pyproject
    assert f"## [{tensorslim.__version__}]" in (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")


_REPO_PATH = re.compile(r"(?<![\w/.-])((?:benchmarks|experiments)/[\w./*{},-]*[\w*}/])")


def _expand_braces(path: str) -> list[str]:
    match = re.search(r"\{([^}]*)\}", path)
    if not match:
        return [path]
    return [path[: match.start()] + option + path[match.end() :] for option in match.group(1).split(",")]


@pytest.mark.parametrize("path", [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))], ids=lambda p: p.name)
def test_named_scripts_and_results_exist(path: Path) -> None:
    """Every ``benchmarks/...`` or ``experiments/...`` path a page names exists (an ``--out`` prefix: some file)."""
    missing = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        for match in _REPO_PATH.finditer(line):
            for candidate in _expand_braces(match.group(1).rstrip("/")):
                if not any(ROOT.glob(candidate if candidate.endswith("*") else candidate + "*")):
                    missing.append(f"line {number}: {candidate}")
    assert not missing, f"{path.relative_to(ROOT)} names files that do not exist:\n" + "\n".join(missing)
