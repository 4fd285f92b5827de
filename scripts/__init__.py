"""Kept scripts: asset builders and diagnostics (``python -m scripts.build_memory``, ...)."""
