"""Small helpers every layer uses: atomic files, environment facts, failpoints, library logs, progress."""
