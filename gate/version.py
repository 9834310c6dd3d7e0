"""gate's version and its name on the package registry: the one module every floor may
import for them (the package's `__init__` is the Python API's front door, above them all)."""

__version__ = "0.1.0"
# The distribution's name on the package registry (`gate` there is another project);
# the command and the import name stay `gate`.
DISTRIBUTION = "gate-llm"


def install_line(extras: str) -> str:
    """The command that installs gate with `extras` (comma-separated extra names)."""
    return f"pip install '{DISTRIBUTION}[{extras}]'"
