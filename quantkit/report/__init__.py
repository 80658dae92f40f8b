"""Comparison reports over runs: terminal table, Markdown, JSON."""
