"""Corral operator: reconciles ModelPreset resources into the presets of node agents."""
