"""ModelPreset objects as the apiserver holds them: a leaf (no kopf, no kmock), so that the
unit tier can build them without importing the operator's runtime (collection time)."""

from __future__ import annotations

from typing import Any


def preset(
    name: str, generation: int = 1, created: str = "2026-01-01T00:00:00Z", **spec: Any
) -> dict[str, Any]:
    """A ModelPreset object as the apiserver holds it (a localPath source unless given)."""
    spec.setdefault("source", {"localPath": {"path": f"/models/{name}.gguf"}})
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "ModelPreset",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "generation": generation,
            "creationTimestamp": created,
        },
        "spec": spec,
    }
