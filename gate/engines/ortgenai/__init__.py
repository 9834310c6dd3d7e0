"""ONNX Runtime GenAI: the engine (`engine.OrtGenAIEngine`) and the model builder that makes
its ONNX folder (`builder`). Nothing is imported here."""
