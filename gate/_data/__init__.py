"""gate's own data in a wheel: `oracle_pins/` and `goldens/`, copied from the checkout's top
level at build time (setup.py); in a checkout this folder holds only this file."""
