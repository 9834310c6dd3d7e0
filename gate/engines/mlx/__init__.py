"""The MLX engine (`--engine mlx`): a model run by Apple's MLX through mlx-lm's model code.

`engine.py` holds `MLXEngine`; the registry imports it only when the engine is chosen, so
mlx is loaded by nothing else.
"""
