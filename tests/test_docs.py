"""The documentation is current: links resolve, the generated parts match their generators, the README's first
screen says what a user needs, `make demo` trains with the preset, and no file narrates the project's development."""

import gzip
import importlib.util
import json
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from hacpo_trl.sharing.presets import SHARING_CHANGES

ROOT = Path(__file__).resolve().parents[1]
LINKED = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "benchmarks").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _module(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def _prose(text: str) -> str:
    """The text outside fenced code blocks and inline code, where a link is a link."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case; letters, marks, digits, '_', '-' and spaces kept; spaces to '-'."""
    kept = (c for c in heading.strip().lower() if c in "-_ " or unicodedata.category(c)[0] in "LMN")
    return "".join(kept).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        base = slug(heading)
        out.add(base if base not in seen else f"{base}-{seen[base]}")
        seen[base] = seen.get(base, 0) + 1
    return out


def test_slug_follows_github():
    assert slug("Cost of a step: GSPO, HACPO and GSPO×2 (`benchmarks/overhead.py`)") == (
        "cost-of-a-step-gspo-hacpo-and-gspo2-benchmarksoverheadpy"
    )
    assert slug("`capability_gate_confidence`") == "capability_gate_confidence"
    assert slug("Rule 8 on validation: the gate's rescue") == "rule-8-on-validation-the-gates-rescue"


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for page in LINKED:
        for target in LINK.findall(_prose(page.read_text())):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no heading with that anchor)")
    assert not broken, "\n".join(broken)


def test_a_broken_link_is_caught(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Top\n\n[ok](#top) [bad](#nowhere) `[code](#ignored)`\n")
    assert [t for t in LINK.findall(_prose(page.read_text()))] == ["#top", "#nowhere"]
    assert "nowhere" not in anchors(page) and "top" in anchors(page)


def test_options_reference_is_current():
    make_options = _module(ROOT / "docs" / "make_options.py")
    package = ROOT / "src" / "hacpo_trl"
    sources = (package / "config.py", package / "run" / "resolve.py", package / "sharing" / "settings.py")
    expected = make_options.render(*(path.read_text() for path in sources))
    assert (ROOT / "docs" / "options.md").read_text() == expected, (
        "docs/options.md is stale: run `make docs` (python docs/make_options.py) and commit it"
    )
    for option in ("peer_filter", "capability_gate_confidence", "solo_steps_per_generation", "band_gate"):
        assert f"### `{option}`" in expected  # every documented option gets its own heading (an anchor)


GRID = ROOT / "benchmarks" / "studies" / "grid"


def test_the_grids_summary_is_current():
    summary = _module(GRID / "summary.py")
    report = json.loads((GRID / "results.json").read_text())
    text = (GRID / "RESULTS.md").read_text()
    committed = text.split("<!-- summary -->\n", 2)[1].rstrip("\n")
    assert committed == "\n".join(summary.lines_for(report)), (
        "benchmarks/studies/grid/RESULTS.md's summary is stale: run `python benchmarks/studies/grid/summary.py`"
    )
    rows = [line for line in committed.splitlines() if line.startswith("| ") and re.search(r"\| \d+/\d+ \|", line)]
    pairs = {line.split(" | ")[0].strip("| ") for line in rows}
    assert pairs == set(report["settings"]) and len(rows) == 2 * len(pairs)  # both agents of every pair


def test_the_grids_summary_reads_its_runs_relative_to_the_checkout():
    """The grid's `--out` is recorded relative to the repository root, so the summary regenerates in any checkout;
    one that is not here (another machine's absolute path) stops the script instead of dropping lines."""
    summary = _module(GRID / "summary.py")
    report = json.loads((GRID / "results.json").read_text())
    assert " --out benchmarks/runs/" in report["command"]
    elsewhere = {**report, "command": report["command"].replace(" --out ", " --out /elsewhere/checkout/")}
    missing = r"no run records at /elsewhere/checkout/benchmarks/runs/\S+/runs\.jsonl\.gz \(the --out"
    with pytest.raises(SystemExit, match=missing):
        summary.lines_for(elsewhere)


# an absolute path of the machine that wrote a file: its checkout, scratch or home folders
MACHINE_PATH = re.compile(rb"(?<![\w.~/-])/(work|tmp|root|home|Users)/")


def test_no_tracked_file_holds_a_machine_path():
    """Records (commands, run folders, logs) hold paths relative to the repository root: an absolute path of the
    machine that wrote them means nothing in another checkout; the run records are read decompressed."""
    for folder in (b"work", b"tmp", b"root", b"home"):
        assert MACHINE_PATH.search(b"--out /" + folder + b"/main/runs") and MACHINE_PATH.search(b"(/" + folder + b"/x)")
    assert not MACHINE_PATH.search(b"--out scratch/tmp/runs https://example.org/home/x ~/work/ benchmarks/runs/")
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    hits = []
    for name in listed.decode().split("\0"):
        path = ROOT / name
        if name and path.is_file():
            data = gzip.decompress(path.read_bytes()) if name.endswith(".gz") else path.read_bytes()
            hits += [f"{name}: {m.group().decode()}..." for m in MACHINE_PATH.finditer(data)][:1]
    assert not hits, "absolute machine paths in tracked files (record them relative to the repository root):\n" + (
        "\n".join(hits[:20])
    )


def test_the_tracked_tree_is_compact():
    """A clone carries code, docs and compact evidence: run folders' weights, logs and summaries stay in the ignored
    run folders (docs/benchmark.md), and the tracked tree stays under 30 MB."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    names = [name for name in listed.decode().split("\0") if name]
    runs = [n for n in names if n.startswith("benchmarks/runs/") and not n.endswith(("/runs.jsonl.gz", "/agents.json"))]
    assert not runs, f"run folder files are tracked (git rm --cached them; the run records suffice): {runs[:5]}"
    size = sum((ROOT / name).stat().st_size for name in names if (ROOT / name).is_file())
    assert size < 30e6, f"the tracked tree is {size / 1e6:.1f} MB; the goal is under 30 MB"


def _heldout_look_rows() -> dict[tuple[str, str], tuple[str, str]]:
    """Each agent's (GSPO − before, preset − GSPO) means in RESULTS.md's `heldout_look` section (the recommended
    preset on held-out, from the committed agents; the section regenerates from the run records)."""
    section = (ROOT / "benchmarks" / "RESULTS.md").read_text().split("<!-- heldout_look -->\n")[1]
    out = {}
    for row in section.splitlines():
        cells = [c.strip() for c in row.strip("|").split("|")]
        if len(cells) == 8 and cells[1].startswith("`"):
            out[cells[0], cells[1].split("`")[1]] = (cells[4].split()[0], cells[5].split()[0])
    return out


def test_readme_first_screen_has_the_commands_the_figure_the_preset_and_its_effect():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move detail to docs/"
    assert any("](benchmarks/preset-vs-gspo.png)" in line for line in lines[:40])  # the figure on the first screen
    first = "\n".join(lines[:60])
    words = " ".join(first.split())
    for command in ("make demo", "make test", "accelerate launch", "hacpo-probe", "--plan"):
        assert command in first, command
    # the preset in one line, whose settings are those its held-out runs ran (on the paper's schedule, GSPO's solo)
    assert re.search(r"^sed -i 's/\^sharing: \.\*/sharing: recommended/' my_pair.yaml ", first, flags=re.M)
    report = json.loads((ROOT / "benchmarks" / "screens" / "heldout-rule19" / "results.json").read_text())
    settings = {k: v for k, v in report["recommended_settings"].items() if k != "solo_steps_per_generation"}
    assert settings == SHARING_CHANGES["recommended"] and report["recommended_sharing"] == "recommended"
    rows = _heldout_look_rows()
    assert len(rows) == 12
    weaker = {("state", "trace-base"), ("size", "trace-small"), ("model", "trace-llama")}
    for (pair, agent), (_, gain) in rows.items():
        if (pair, agent) in weaker or pair in ("complement", "equal") or agent == "trace-large":
            assert gain.replace("-", "−") in words or gain in words, (
                pair,
                agent,
                gain,
            )  # each claimed gain, as measured
    lows = sorted(float(learned) for learned, _ in rows.values())
    assert f"+{lows[0]:.3f} to +{lows[-1]:.3f}" in words  # GSPO's own gain, its range over the agents


def _makefile_flags(name: str) -> dict[str, str]:
    """A Makefile variable of `--key value` flags, as a mapping."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    words = re.search(rf"^{name} = (.*)$", text, flags=re.M).group(1).split()
    return dict(zip(words[::2], words[1::2], strict=True))


def test_make_demo_trains_with_the_recommended_preset():
    reproduce = _module(ROOT / "benchmarks" / "reproduce.py")
    assert reproduce.PRESET_METHODS["recommended"] == reproduce.RECOMMENDED  # its settings: tests/test_presets.py
    assert _makefile_flags("PRESET_ARGS") == {"--sharing": "recommended"}
    flags = reproduce._flags(reproduce.METHODS["GSPO"][0])
    assert _makefile_flags("GSPO_ARGS") == dict(zip(flags[::2], flags[1::2], strict=True))


@pytest.mark.parametrize(
    ("args", "folder", "preset"),
    [((), "outputs/demo_size_preset", True), (("DEMO_METHOD=paper",), "outputs/demo_size_paper", False),
     (("DEMO_PAIR=state", "DEMO_METHOD=gspo"), "outputs/demo_state_gspo", False)],
)  # fmt: skip
def test_each_demo_variant_has_its_own_folder(tmp_path, args, folder, preset):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").touch()
    (venv / ".installed").touch()  # newer than pyproject.toml: nothing to install
    dry = subprocess.run(
        ["make", "-n", "demo", f"VENV={venv}", *args], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert f"--output_dir {folder} " in dry
    assert (
        "--sharing recommended --per_device_train_batch_size 32 --steps_per_generation 2 --max_steps 24" in dry
    ) == (preset)


def test_no_file_narrates_the_projects_development():
    pattern = re.compile(
        r"\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|next|previous|this|that|last) "
        r"session\b|session's machine",
        re.I,
    )
    files = [ROOT / "README.md", ROOT / "Makefile", ROOT / ".gitignore"]
    for folder, glob in (("docs", "*"), ("benchmarks", "*.md"), ("benchmarks", "*/*.md"), ("benchmarks", "*.py")):
        files += sorted((ROOT / folder).glob(glob))
    for folder in ("src", "tests", "recipes", "accelerate_configs"):
        files += sorted(p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".yaml", ".md"))
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in files
        if path.is_file()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line) and path != Path(__file__)
    ]
    assert not found, "\n".join(found)
