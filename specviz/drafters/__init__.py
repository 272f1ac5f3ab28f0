"""Drafters: one module per family, all satisfying the small `Drafter` protocol of specviz/engine/drafter.py."""
