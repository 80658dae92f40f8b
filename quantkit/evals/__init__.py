"""Evaluators: compare a runtime's predictions with the cached baseline reference."""
