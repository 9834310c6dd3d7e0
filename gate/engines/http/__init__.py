"""Engines behind an HTTP server: vLLM's OpenAI API with token ids (`openai`), OpenAI-style
servers that take text (`openai_text`), llama.cpp's native API (`llama_server`, the server
process in `llama_server_process`); the dialect machinery (`server`) and the bounded client
(`openai_http`). Nothing is imported here."""
