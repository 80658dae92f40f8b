"""A run's life: the quantize pipeline, the journal that lets it resume, and the manifest
assembled at its end."""
