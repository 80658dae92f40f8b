"""Runtimes: how an artifact (or the baseline) is loaded and scored."""
