"""The bundle's docs state numbers and names that must follow the code."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml
from fsdp_api.presets import PRESETS
from fsdp_localcluster.binaries import tool_path

from tests.bundle.manifests import REPO_ROOT, load_all, run

GIB = 2**30
DOCS = REPO_ROOT / "docs"


def test_sharding_memory_table_matches_the_presets() -> None:
    """docs/sharding.md: 16 bytes/parameter sharded over S ranks, for every preset but tiny."""
    rows = {}
    for line in (DOCS / "sharding.md").read_text().splitlines():
        m = re.match(r"\| `([\w.-]+)` \| ([\d.]+) B \|((?: [\d.]+ \|)+)$", line)
        if m:
            rows[m.group(1)] = (float(m.group(2)), [float(x) for x in m.group(3).strip(" |").split(" | ")])
    assert set(rows) == set(PRESETS) - {"tiny"}
    for name, (billions, cells) in rows.items():
        n = PRESETS[name].num_params()
        assert billions == round(n / 1e9, 2), name
        expected = [16 * n / 8, 16 * n / 16, 16 * n / 64, 16 * n / 16 + 2 * n, 16 * n / 8, 16 * n]
        assert cells == [round(x / GIB, 1) for x in expected], name


# Every page the project ships: the README and docs/ (new pages are checked without being listed).
PAGES = [REPO_ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
ROOTS = "api|bench|charts|docs|examples|kustomize|localcluster|operator|tests|tools|trainer"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_docs_cite_files_that_exist(page: Path) -> None:
    """Paths a page cites in backticks (`kustomize/...`, `api/fsdp_api/...`) exist."""
    cited = re.compile(rf"`((?:{ROOTS})/[\w./-]+)`")
    for path in cited.findall(page.read_text()):
        assert (REPO_ROOT / path.rstrip("/")).exists(), f"{page.name} cites {path}, which does not exist"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_docs_links_lead_to_files_and_headings_that_exist(page: Path) -> None:
    """Relative Markdown links ([text](other.md#heading)) lead to a file, and to a heading of it."""
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"[a-z]+:", target) or re.search(r"[*\[\\]", target):
            continue  # a URL (https:, mailto:), or a regular expression that looks like a link
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.exists(), f"{page.name} links to {target}, which does not exist"
        if anchor and file.suffix == ".md":
            assert anchor in headings(file), f"{page.name} links to {target}: no such heading in {file.name}"


def headings(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    anchors = set()
    for title in re.findall(r"^#+ (.+)$", page.read_text(), re.MULTILINE):
        anchors.add(re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-"))
    return anchors


def test_quickstart_karpenter_overlay_example_builds(tmp_path: Path) -> None:
    """The overlay that docs/quickstart-eks.md tells users to write fills every placeholder."""
    text = (DOCS / "quickstart-eks.md").read_text()
    block = re.search(r"```yaml\n# my-cluster/karpenter/kustomization.yaml\n(.*?)```", text, re.S)
    assert block, "the Karpenter overlay example is gone from docs/quickstart-eks.md"
    base = os.path.relpath(REPO_ROOT / "kustomize" / "overlays" / "karpenter", tmp_path)
    (tmp_path / "kustomization.yaml").write_text(block.group(1).replace("../../kustomize/overlays/karpenter", base))
    objs = {o["kind"]: o for o in load_all(run([tool_path("kubectl"), "kustomize", tmp_path]))}
    assert "${CLUSTER_NAME}" not in yaml.safe_dump(objs)
    assert objs["EC2NodeClass"]["spec"]["role"] == "KarpenterNodeRole-my-cluster"
    assert objs["NodePool"]["spec"]["limits"]["nvidia.com/gpu"] == "128"
