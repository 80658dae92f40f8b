"""llama.cpp's side: the GGUF file reader, quantization types, overrides, splicing, the
converter and the builder."""
