"""Serving: latency under load and quality measured through an OpenAI-compatible endpoint
(vLLM, llama.cpp's server, llama-cpp-python's server, Ollama, any), and ``quantkit serve``,
which starts llama-cpp-python's server on a GGUF."""
