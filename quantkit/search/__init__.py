"""Sensitivity profiles and recipe search (GGUF per-tensor mixes)."""
