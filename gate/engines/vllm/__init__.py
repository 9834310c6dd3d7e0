"""vLLM in-process: the engine (`engine.VLLMEngine`), its routing worker extension and
`gate diagnose`'s capture extension. Nothing is imported here, so naming the package loads no vllm."""
