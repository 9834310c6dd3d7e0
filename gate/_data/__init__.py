"""gate's own data: `oracle_pins/` and `goldens/` (in a checkout, links to the top-level
folders; in a wheel, their files) and `models/` (the Qwen3.6 test checkpoint)."""
