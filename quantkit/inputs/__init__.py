"""What a run reads: recipes and their sections, model sources, GGUF sources, texts, token
windows and safetensors headers."""
