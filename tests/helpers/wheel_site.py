"""The wheel built from this checkout (only the files git knows, tracked or not), unpacked
into a folder that can stand on PYTHONPATH as "the package installed": its entry points
(the `gate` command, the pytest plugin) are found from its dist-info."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def build_wheel_site(build: Path) -> Path:
    src = build / "src"
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    for name in filter(None, files):
        path = ROOT / name
        if path.is_symlink():  # gate/_data's links to the top-level pins and goldens: kept as links
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            (src / name).symlink_to(os.readlink(path))
        elif path.is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, src / name)
    out = build / "wheel"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (whl,) = out.glob("*.whl")
    site = build / "site"
    with zipfile.ZipFile(whl) as z:
        z.extractall(site)
    return site
