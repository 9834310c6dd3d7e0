"""llama.cpp through llama-cpp-python: the engine (`engine.LlamaCppEngine`) and `gate diagnose`'s
capture adapter (ggml's eval callback). Nothing is imported here."""
