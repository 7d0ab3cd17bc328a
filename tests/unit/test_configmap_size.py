"""The presets ConfigMap's size at cluster scale, against the apiserver's 1 MiB limit.

Two placements: a typical cluster (four GPU pools, 20 presets, each on one pool or on every
node: four distinct node sets) and the worst case (every node its own combination of 5 out of
40 presets, selected by per-node labels). ``python tests/unit/test_configmap_size.py`` prints
the figures quoted in operator/README.md.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from preset_operator.render import CONFIGMAP_LIMIT, configmap_size, render

Objects = list[dict[str, Any]]
Nodes = dict[str, dict[str, str]]


def modelpreset(name: str, selector: dict[str, str]) -> dict[str, Any]:
    """A realistic preset: a Hugging Face source, a few args, an alias, load-on-startup."""
    return {
        "metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {
            "modelName": f"org/{name}-GGUF:Q4_K_M",
            "source": {"huggingFace": {"repo": f"org/{name}-GGUF", "file": f"{name}-Q4_K_M.gguf"}},
            "args": ["--ctx-size", "8192", "--flash-attn", "on"],
            "aliases": [name],
            "lifecycle": {"loadOnStartup": True},
            "placement": {"nodeSelector": selector},
        },
    }


def typical(nodes: int) -> tuple[Objects, Nodes]:
    pools = ["a100", "h100", "l40s", "a10"]
    agents = {f"gpu-node-{i:05d}": {"gpu": pools[i % 4]} for i in range(nodes)}
    presets = [
        modelpreset(f"model-{j:02d}", {"gpu": pools[j % 4]} if j % 5 else {}) for j in range(20)
    ]
    return presets, agents


def every_node_its_own(nodes: int, per_node: int = 5, total: int = 40) -> tuple[Objects, Nodes]:
    rng = random.Random(0)
    agents = {
        f"gpu-node-{i:05d}": {
            f"corral.dev/p{j:02d}": "yes" for j in rng.sample(range(total), per_node)
        }
        for i in range(nodes)
    }
    presets = [modelpreset(f"model-{j:02d}", {f"corral.dev/p{j:02d}": "yes"}) for j in range(total)]
    return presets, agents


def size(placement: tuple[Objects, Nodes]) -> int:
    return configmap_size(render(*placement).configmap_data())


@pytest.mark.parametrize("scenario", [typical, every_node_its_own])
def test_five_thousand_nodes_fit_in_one_configmap(scenario: Any) -> None:
    assert size(scenario(5000)) < CONFIGMAP_LIMIT * 0.3


def test_the_size_grows_with_nodes_not_with_their_combinations() -> None:
    # ~35 bytes per node, whatever the placement: the presets' own text is stored once.
    per_node = (size(every_node_its_own(1000)) - size(every_node_its_own(100))) / 900
    assert 25 < per_node < 45


def main() -> None:
    print(f"{'placement':<22} {'nodes':>6} {'files':>6} {'bytes':>9}  (limit {CONFIGMAP_LIMIT})")
    for scenario in (typical, every_node_its_own):
        for nodes in (500, 5000):
            rendering = render(*scenario(nodes))
            total = configmap_size(rendering.configmap_data())
            print(f"{scenario.__name__:<22} {nodes:>6} {len(rendering.files):>6} {total:>9}")


if __name__ == "__main__":
    main()
