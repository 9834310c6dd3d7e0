"""transformers: the engine (`engine.HFEngine`), its batched schedules, MoE routing hooks and
`gate diagnose`'s capture adapter. Nothing is imported here, so naming the package loads no torch."""
